"""Sizing before touching a cluster: ``hpkv plan`` (tier capacities, L2 load vs recompute, cost)
and ``hpkv simulate`` (cache tiers and routing strategies under a workload).

Modules: ``catalog`` (models, GPUs, instance types), ``costmodel`` (capacities and timings),
``plan``, ``workload`` (generators, traces), ``simulate`` (the cluster model), ``runner`` (a
simulation from settings to result), ``chart`` (matplotlib, imported lazily), ``replay`` (a bench
result against the model). This module holds the ``sizing`` section of hpkv.yaml.
"""

from __future__ import annotations

from typing import Any

from hpkv.sizing.catalog import CATALOG_SCHEMA
from hpkv.sizing.costmodel import COST_PARAMS_SCHEMA, TRAFFIC_SCHEMA
from hpkv.sizing.workload import SPEC_FIELDS, WORKLOAD_KINDS

STRATEGIES = ("roundrobin", "session", "prefixaware", "kvaware")

_SPEC_TYPES = {
    "rate": {"type": "number", "exclusiveMinimum": 0},
    "skew": {"type": "number", "minimum": 0},
    "overlap": {"type": "number", "minimum": 0, "maximum": 1},
    "contextTokens": {"type": "integer", "minimum": 0},
    "answerTokens": {"type": "integer", "minimum": 0},
}

SIMULATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "workload": {"type": "string", "enum": list(WORKLOAD_KINDS)},
        **{
            key: _SPEC_TYPES.get(key, {"type": "integer", "minimum": 1})
            for key in SPEC_FIELDS
            if key != "kind"
        },
        "strategies": {
            "type": "array",
            "items": {"type": "string", "enum": list(STRATEGIES)},
            "minItems": 1,
            "uniqueItems": True,
        },
        "seed": {"type": "integer", "minimum": 0},
        "l2TtlSeconds": {"type": "number", "minimum": 0, "description": "seconds, 0 for none"},
        "kvawareThreshold": {"type": "integer", "minimum": 0},
        "chart": {"type": "string", "minLength": 1, "description": "a PNG path"},
    },
}

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "model": {
            "type": "string",
            "minLength": 1,
            "description": "a catalog key such as qwen2-7b, or the path of a config.json",
        },
        "instanceType": {"type": "string", "minLength": 1, "description": "e.g. ml.g6e.4xlarge"},
        "replicas": {"type": "integer", "minimum": 1},
        "tp": {"type": "integer", "minimum": 1},
        **CATALOG_SCHEMA,
        "costModel": COST_PARAMS_SCHEMA,
        "traffic": TRAFFIC_SCHEMA,
        "simulate": SIMULATE_SCHEMA,
    },
}

CONFIG_DEFAULTS: dict[str, Any] = {
    "model": "qwen2-7b",
    "instanceType": "ml.g6e.4xlarge",
    "replicas": 2,
    "tp": 1,
}
