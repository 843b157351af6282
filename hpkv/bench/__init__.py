"""Stage 5: ``hpkv bench`` — measure cross-pod L2 hits, TTFT speedup and L2 read latency.

Modules:

* ``runner``   the self-contained, stdlib-only load engine (shipped in a ConfigMap, run as a Job
               with the endpoint's serving image; imported in-process for ``--from-here``);
* ``endpoint`` finds an InferenceEndpointConfig's worker pods, port, routing service and image;
* ``job``      the in-cluster launcher: ConfigMap + (Indexed) Job, log collection, clean-up;
* ``metrics``  /metrics snapshots through the API server's pod proxy, per-tier hit rates, and
               LMCache log lines;
* ``core``     one bench run end to end (plan, run scenarios, assemble the result);
* ``results``  the versioned result document (``schema/bench-result-v1.schema.json``) and summaries;
* ``report``, ``charts``, ``compare``: Markdown, PNG charts (matplotlib, Agg) and A/B comparison.

This module stays import-light: it is loaded by the config schema on every command.
"""

from __future__ import annotations

from typing import Any

# 'hpkv diagnose --iam': the bench talks to Kubernetes and the endpoint only (plus the
# DescribeCluster every command makes to find the cluster).
IAM_ACTIONS: list[Any] = []

SCHEMA_VERSION = "1.0"
RESULT_KIND = "HpkvBenchResult"
SCENARIOS = ("cross-pod", "shared-prefix", "multi-turn")

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "resultsDir": {
            "type": "string",
            "minLength": 1,
            "description": "directory for result JSON, report and charts (a folder per run)",
        },
        "image": {
            "type": "string",
            "minLength": 1,
            "description": "image for the runner Job (default: the endpoint's own serving image)",
        },
        "python": {
            "type": "string",
            "minLength": 1,
            "description": "the Python interpreter in that image",
        },
        "port": {
            "type": "integer",
            "minimum": 1,
            "maximum": 65535,
            "description": "the workers' vLLM port (default: the endpoint's modelInvocationPort)",
        },
        "barrierPort": {
            "type": "integer",
            "minimum": 1024,
            "maximum": 65535,
            "description": "TCP port the client pods of --clients N use to start together",
        },
        "cpu": {"type": "string", "minLength": 1, "description": "CPU request of a runner pod"},
        "memory": {"type": "string", "minLength": 1, "description": "memory of a runner pod"},
        "nodeSelector": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "node labels for the runner pods (e.g. a client node group)",
        },
        "tolerations": {
            "type": "array",
            "items": {"type": "object"},
            "description": "Kubernetes tolerations for the runner pods",
        },
    },
}
CONFIG_DEFAULTS: dict[str, Any] = {
    "resultsDir": "hpkv-bench",
    "python": "python3",
    "barrierPort": 29600,
    "cpu": "2",
    "memory": "2Gi",
}
