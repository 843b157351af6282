"""`hpkv status` against the AWS emulator and the real kube-apiserver: one table, one state,
Nagios exit codes, the JSON schema, slow or unreachable APIs, and --watch."""

from __future__ import annotations

import json
import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.harness.aws import Fault
from tests.harness.kube_proxy import KubeProxy
from tests.harness.scenario import Scenario
from tests.harness.stack import Stack
from tests.health.conftest import validate

pytestmark = [pytest.mark.kube, pytest.mark.aws]

ENABLED = {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}
STAGES = ["cluster", "tiered-storage", "operator", "curvine", "l2", "bench"]
STAGE_1 = ("--stage", "cluster", "--stage", "tiered-storage")


def _json(scenario: Scenario, *args: str) -> tuple[int, dict]:
    result = scenario.hpkv("status", "--cluster", "demo", "-o", "json", *args)
    assert result.exception is None, result
    document = json.loads(result.stdout)
    validate(document, "status")
    return result.exit_code, document


def _stable(document: dict) -> dict:
    """The document without the timings that differ from run to run."""
    checks = [{**c, "seconds": None} for c in document["checks"]]
    return {**document, "generatedAt": None, "durationSeconds": None, "checks": checks}


def _by_name(document: dict) -> dict[tuple[str, str], dict]:
    return {(c["stage"], c["name"]): c for c in document["checks"]}


def test_healthy_cluster_is_ok_in_every_format(stack: Stack) -> None:
    """Every stage installed by hpkv: one OK table, each stage's checks and each endpoint's L2
    wiring rows (per pod)."""
    stack.install()
    scenario = stack.scenario
    code, doc = _json(scenario)
    assert code == 0 and doc["state"] == "OK" and doc["exitCode"] == 0, _not_ok(doc)
    assert [s["stage"] for s in doc["stages"]] == STAGES
    assert [s["installed"] for s in doc["stages"]] == [None, True, True, True, True, None]
    checks = _by_name(doc)
    assert checks[("cluster", "nodes")]["evidence"] == "2 of 2 nodes Ready (2 HyperPod nodes)"
    assert checks[("cluster", "eks-cluster")]["evidence"].startswith("hpkv-eks is ACTIVE")
    assert checks[("tiered-storage", "ai-toolkit-daemonset")]["state"] == "ok"
    assert checks[("operator", "addon/amazon-sagemaker-hyperpod-inference")]["state"] == "ok"
    assert checks[("operator", "role/execution")]["evidence"].startswith(
        "SageMakerHyperPodInference-demo (managed by hpkv)"
    )
    assert checks[("curvine", "master")]["evidence"].startswith("Active")
    assert checks[("curvine", "workers")]["evidence"] == "live 2, lost 0, GPU nodes 2"
    assert "wires new pods at admission" in checks[("l2", "l2 team-a/llama")]["evidence"]
    pods = [c for (stage, name), c in checks.items() if stage == "l2" and name.startswith("pod ")]
    assert sorted(c["name"] for c in pods) == [f"pod team-a/{p}" for p in stack.worker_pods()]
    assert all("wrote and read back a file" in c["evidence"] for c in pods)  # exec probe ran
    assert checks[("bench", "latest-result")]["evidence"].startswith("no benchmark result")

    as_yaml = scenario.hpkv("status", "--cluster", "demo", "-o", "yaml")
    assert _stable(yaml.safe_load(as_yaml.stdout)) == _stable(doc)
    table = scenario.hpkv("status", "--cluster", "demo")
    assert table.exit_code == 0 and table.stderr == ""
    assert "STAGE" in table.stdout and "ai-toolkit-daemonset" in table.stdout
    assert f"overall: OK ({len(doc['checks'])} checks in" in table.stdout

    # Each stage's own status command still reports the same checks.
    for stage in ("operator", "curvine", "l2"):
        own = scenario.hpkv(stage, "status", "--cluster", "demo", "-o", "json")
        assert own.exit_code == 0, own
        names = [c["name"] for c in json.loads(own.stdout)["checks"]]
        assert names == [c["name"] for c in doc["checks"] if c["stage"] == stage]


def _not_ok(doc: dict) -> list[tuple[str, str, str]]:
    return [(c["stage"], c["name"], c["evidence"]) for c in doc["checks"] if c["state"] != "ok"]


def test_not_installed_stage_reads_not_installed_and_warns(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.nodes(1)
    code, doc = _json(scenario)
    assert code == 1 and doc["state"] == "WARNING"
    assert doc["stages"][1] == {
        "stage": "tiered-storage",
        "number": 1,
        "title": "Tiered Storage (L1 CPU memory tier)",
        "installed": False,
        "state": "WARNING",
    }
    checks = _by_name(doc)
    assert checks[("tiered-storage", "tiered-storage")]["evidence"].startswith("not installed")
    for stage in ("operator", "curvine", "l2"):
        [row] = [c for c in doc["checks"] if c["stage"] == stage]
        assert (row["name"], row["state"], row["evidence"]) == (
            "installed",
            "warn",
            "not installed",
        )
        assert row["remediation"] == f"run 'hpkv {stage} apply'"
    assert [s["installed"] for s in doc["stages"][2:]] == [False, False, False, None]


def test_missing_daemonset_is_critical(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    code, doc = _json(scenario)
    assert code == 2 and doc["state"] == "CRITICAL"


def test_shared_reads_are_made_once(stack: Stack) -> None:
    """Every stage installed: each read checks and installation probes share is made once,
    including the clusters the Kubernetes connection is found from (no --context here)."""
    stack.install()
    scenario = stack.scenario
    aws_mark, kube_mark = scenario.aws.mark(), scenario.kube.audit_mark()
    code, _doc = _json(scenario)
    assert code == 0
    calls = [str(c) for c in scenario.aws.calls_since(aws_mark)]
    assert calls.count("sagemaker:DescribeCluster -> 200") == 1, calls
    assert calls.count("eks:DescribeCluster -> 200") == 1, calls
    # Six add-ons (five of the operator, the EBS CSI driver), five operator roles: once each,
    # although installation probes, add-on checks and role checks all read them.
    assert calls.count("eks:DescribeAddon -> 200") == 6, calls
    assert calls.count("iam:GetRole -> 200") == 5, calls
    assert calls.count("iam:ListAttachedRolePolicies -> 200") == 5, calls
    reads = [str(e) for e in scenario.kube.audit_since(kube_mark)]
    assert reads.count("list nodes  -> 200") == 1, reads  # cluster, stage 1 and stage 3 share it
    assert reads.count("list pods team-a/ -> 200") == 1, reads  # installation probe and checks
    assert reads.count("get deployments team-a/llama -> 200") == 1, reads
    # The Helm releases come from their storage Secrets (one list each), not from helm runs.
    assert reads.count("list secrets curvine/ -> 200") == 2, reads
    assert not any(r.startswith("get /version ") for r in reads), reads


def test_slow_aws_api_yields_unknown_for_its_checks_without_hanging(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    scenario.ai_toolkit()
    scenario.aws.inject(Fault("sagemaker", "DescribeCluster", kind="delay", seconds=5, times=-1))
    started = time.monotonic()
    code, doc = _json(scenario, "--context", "hpkv-test", "--check-timeout", "1s")
    assert time.monotonic() - started < 4.5
    checks = _by_name(doc)
    assert checks[("tiered-storage", "cluster")]["state"] == "unknown"
    assert "no answer within 1s" in checks[("tiered-storage", "cluster")]["evidence"]
    assert checks[("cluster", "nodes")]["state"] == "ok"  # Kubernetes is fine
    assert checks[("cluster", "kubernetes-api")]["state"] == "ok"
    assert code == 3 and doc["state"] == "UNKNOWN"


def test_slow_kubernetes_api_yields_unknown_for_its_checks(
    scenario: Scenario, kube_proxy: KubeProxy
) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    scenario.ai_toolkit()
    kube_proxy.latency = 3.0
    started = time.monotonic()
    code, doc = _json(scenario, "--check-timeout", "1s")
    assert time.monotonic() - started < 3.5
    checks = _by_name(doc)
    assert checks[("cluster", "nodes")]["state"] == "unknown"
    assert checks[("tiered-storage", "ai-toolkit-daemonset")]["state"] == "unknown"
    assert checks[("tiered-storage", "tiered-storage")]["state"] == "ok"  # AWS is fine
    assert code == 3


def test_unreachable_kubernetes_api_is_unknown_with_the_cause(scenario: Scenario) -> None:
    from tests.harness.kube import free_port

    scenario.hyperpod(tiered_storage=ENABLED)
    config = yaml.safe_load(scenario.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    scenario.kubeconfig.write_text(yaml.safe_dump(config))
    code, doc = _json(scenario, "--context", "hpkv-test")
    evidence = _by_name(doc)[("cluster", "kubernetes-api")]["evidence"]
    assert "cannot reach the Kubernetes API" in evidence
    assert code == 3


def test_stage_filter_and_unknown_stage(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    scenario.ai_toolkit()
    code, doc = _json(scenario, "--stage", "tiered-storage")
    assert code == 0 and [s["stage"] for s in doc["stages"]] == ["tiered-storage"]
    bad = scenario.hpkv("status", "--cluster", "demo", "--stage", "curvin")
    assert bad.exit_code == 3 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "hpkv: error: unknown stage 'curvin'. Fix: use one of: cluster, tiered-storage, "
        "operator, curvine, l2, bench"
    ]


def test_without_a_cluster_it_is_unknown_in_one_line(scenario: Scenario) -> None:
    result = scenario.hpkv("status")
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr.startswith("hpkv: error: no HyperPod cluster given")
    assert len(result.stderr.strip().splitlines()) == 1


def test_stage_status_commands_still_work_beside_it(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    scenario.ai_toolkit()
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 0
    assert [c["name"] for c in json.loads(result.stdout)["checks"]] == [
        "cluster",
        "tiered-storage",
        "node-recovery",
        "ai-toolkit-daemonset",
    ]


def test_watch_without_a_terminal_prints_one_document_per_refresh(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    scenario.ai_toolkit()
    started = time.monotonic()
    result = scenario.hpkv(
        "status", "--cluster", "demo", "-o", "json", "--watch", "--interval", "1s",
        "--iterations", "2", *STAGE_1,
    )  # fmt: skip
    assert result.exit_code == 0, result
    assert time.monotonic() - started >= 1.0
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        validate(json.loads(line), "status")
    table = scenario.hpkv(
        "status", "--cluster", "demo", "-w", "--interval", "1", "--iterations", "2", *STAGE_1
    )
    assert table.stdout.count("overall: OK") == 2


def test_watch_on_a_terminal_refreshes_in_place(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage=ENABLED)
    scenario.nodes(1)
    scenario.ai_toolkit()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    args = ["status", "--cluster", "demo", "--watch", "--interval", "1s", "--iterations", "2"]
    args += STAGE_1
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execve(sys.executable, [sys.executable, "-m", "hpkv", *args], env)
    output = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
    _, status = os.waitpid(pid, 0)
    text = output.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "refresh 1 of 2" in text and "refresh 2 of 2" in text
    assert "\x1b[" in text  # drawn with cursor control, not printed line after line
