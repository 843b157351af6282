"""`hpkv up` / `hpkv down` through the CLI: the combined plan, one confirmation, per-stage progress
on stderr and data on stdout, stopping at a failed stage with its findings, resuming, and `down`
keeping data, volumes and IAM roles unless a flag names them.

The whole runbook runs on the world of tests/harness/runbook.py (every stage's controllers
played); tests about the CLI's mechanics use `--through tiered-storage` to stay fast."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_on_tty
from tests.harness.runbook import (
    CURVINE_NAMESPACE,
    ENDPOINT_NAMESPACE,
    L2_PVC,
    RunbookWorld,
    delete_endpoint,
    fresh_cluster,
    runbook_stages,
)
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]

REPO = Path(__file__).resolve().parents[2]
STAGE1 = ("--through", "tiered-storage")
ROLES = {
    "SageMakerHyperPodInference-demo",
    "HyperPodInference-demo-S3Csi",
    "HyperPodInference-demo-FsxCsi",
    "HyperPodInference-demo-Alb",
    "HyperPodInference-demo-Keda",
}


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("hpkv: error: ")]


def test_up_runs_every_stage_in_order_with_deferred_plans_and_progress(
    runbook_world: RunbookWorld,
) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    result = scenario.hpkv("up", "--cluster", "demo", "--yes")
    assert result.exit_code == 0, result
    out, total = result.stdout, len(runbook_stages())
    headers = [out.index(f"stage {i}/{total}: {n}:") for i, n in enumerate(runbook_stages(), 1)]
    assert headers == sorted(headers)
    assert "not configured -> Enable at 20%" in out
    assert "plan: operator" in out and "eks addon/amazon-sagemaker-hyperpod-inference" in out
    # Curvine's PVCs and the L2 wiring need the operator's CRD: planned after it runs
    assert "will be planned after stage operator runs" in out
    assert "2 stage(s) planned after earlier ones run" in out
    progress = result.stderr.splitlines()
    assert progress[:3] == [
        f"[1/{total}] tiered-storage: planning",
        f"[1/{total}] tiered-storage: 1 change(s) planned",
        f"[2/{total}] operator: planning",
    ]
    assert f"[3/{total}] curvine: will be planned after stage operator runs" in progress
    assert f"[3/{total}] curvine: planning again (an earlier stage ran)" in progress
    done = [line for line in progress if ": done, " in line]
    assert [line.split(":")[0] for line in done] == [
        f"[{i}/{total}] {n}" for i, n in enumerate(runbook_stages(), 1)
    ]
    assert all(line.endswith("verification ok") for line in done), done
    assert "[1/" not in out  # progress never on stdout
    assert "\x1b[" not in result.stderr  # plain lines without a terminal


def test_up_json_is_one_document_on_stdout(runbook_world: RunbookWorld) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    result = scenario.hpkv("up", "--cluster", "demo", *STAGE1, "--yes", "-o", "json")
    assert result.exit_code == 0, result
    payload = json.loads(result.stdout)
    assert payload["command"] == "up" and payload["applied"] is True
    assert payload["failed"] is None and payload["changes"] == 1
    (stage,) = payload["stages"]
    assert stage["state"] == "applied"
    assert stage["plan"]["actions"][0]["after"]["Mode"] == "Enable"
    assert stage["result"]["checks"][0]["state"] == "ok"
    assert "[1/1] tiered-storage: applying 1 change(s)" in result.stderr


def test_up_without_tty_or_yes_refuses_and_changes_nothing(runbook_world: RunbookWorld) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo")
    assert result.exit_code == 2
    (line,) = _error_lines(result.stderr)
    assert "refusing to apply 13 change(s) and 2 stage(s) planned after earlier ones run" in line
    assert "--yes" in line
    assert "plan: tiered-storage" in result.stdout and "plan: operator" in result.stdout
    assert scenario.writes_since(mark) == []


def test_up_dry_run_changes_nothing(runbook_world: RunbookWorld) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--dry-run", "-o", "json")
    assert result.exit_code == 0, result
    payload = json.loads(result.stdout)
    assert payload["dryRun"] is True and payload["applied"] is False
    states = {s["stage"]: s["state"] for s in payload["stages"]}
    assert states == {
        "tiered-storage": "planned",
        "operator": "planned",
        "curvine": "deferred",
        "l2": "deferred",
    }
    assert {s["stage"]: (s["deferred"] or {}).get("after") for s in payload["stages"]} == {
        "tiered-storage": None,
        "operator": None,
        "curvine": "operator",
        "l2": "operator",
    }
    assert scenario.writes_since(mark) == []


@pytest.mark.parametrize(("answer", "code", "writes"), [("n", 1, 0), ("y", 0, 1)])
def test_up_on_a_terminal_asks_once(
    runbook_world: RunbookWorld, answer: str, code: int, writes: int
) -> None:
    """Once for every stage, the deferred ones included (their new plans delete nothing)."""
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    mark = scenario.mark()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NO_COLOR", None)
    status, output = run_on_tty(["up", "--cluster", "demo"], [(b"[y/N]", answer.encode())], env)
    assert status == code, output
    assert output.count("[y/N]") == 1
    assert "Apply 13 change(s)" in output
    made = [w for w in scenario.writes_since(mark) if "UpdateCluster" in w]
    assert len(made) == writes
    if answer == "y":
        total = len(runbook_stages())
        assert f"1/{total} tiered-storage" in output  # the rich stage rule
        assert f"✓ [{total}/{total}] l2: done" in output


def test_failed_stage_prints_findings_and_a_rerun_continues(scenario: Scenario) -> None:
    # HyperPod accepts the update but never deploys the ai-toolkit DaemonSet: verification fails.
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(2)
    result = scenario.hpkv("up", "--cluster", "demo", *STAGE1, "--yes", "--timeout", "1s")
    assert result.exit_code == 1, result
    (line,) = _error_lines(result.stderr)
    assert line.startswith("hpkv: error: stage tiered-storage failed: DaemonSet aws-hyperpod/")
    assert line.endswith("then rerun 'hpkv up' (it continues where it stopped)")
    assert result.stderr.strip().splitlines()[-1] == line
    assert "[1/1] tiered-storage: failed: DaemonSet" in result.stderr
    assert "tiered-storage: diagnose findings" in result.stdout
    assert "ai-toolkit-daemonset" in result.stdout and "CRITICAL" in result.stdout

    # The operator fixes the cause; the rerun continues: nothing left to change, verification ok.
    scenario.ai_toolkit()
    mark = scenario.mark()
    again = scenario.hpkv("up", "--cluster", "demo", *STAGE1, "--yes", "-o", "json")
    assert again.exit_code == 0, again
    assert scenario.writes_since(mark) == []
    assert json.loads(again.stdout)["stages"][0]["state"] == "converged"


def test_failure_json_names_the_stage_and_its_findings(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(1)
    result = scenario.hpkv(
        "up", "--cluster", "demo", *STAGE1, "--yes", "--timeout", "1s", "-o", "json"
    )
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["failed"] == "tiered-storage"
    stage = payload["stages"][0]
    assert stage["state"] == "failed" and "DaemonSet" in stage["error"]
    assert {f["name"] for f in stage["findings"]} >= {"ai-toolkit-daemonset"}


def test_a_failed_stage_prints_its_diagnose_findings(scenario: Scenario) -> None:
    """Tiered Storage enabled, but HyperPod never starts the ai-toolkit DaemonSet: `up` stops at
    the stage and prints what `hpkv diagnose` finds for it."""
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(1)
    result = scenario.hpkv("up", "--cluster", "demo", *STAGE1, "--yes", "--timeout", "1s")
    assert result.exit_code == 1
    text = " ".join(result.stdout.split())
    assert "tiered-storage.ai-toolkit-not-on-every-node" in text, result.stdout


def test_planning_failure_changes_nothing_and_says_so(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery=None)  # UpdateCluster would be rejected: hpkv refuses first
    scenario.nodes(1)
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--yes")
    assert result.exit_code == 1
    (line,) = _error_lines(result.stderr)
    assert "planning stage tiered-storage failed: DescribeCluster reports no NodeRecovery" in line
    assert "node-recovery" in result.stdout  # the finding
    assert scenario.writes_since(mark) == []


def test_a_stage_deferred_to_one_outside_the_range_fails_before_any_change(
    runbook_world: RunbookWorld,
) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--from", "curvine", "--yes")
    assert result.exit_code == 1, result
    (line,) = _error_lines(result.stderr)
    assert "planning stage curvine failed: it needs stage operator first" in line
    assert "include stage operator" in line
    assert scenario.writes_since(mark) == []


def _pvc_names(world: RunbookWorld) -> set[str]:
    status, body = world.kube.raw("GET", "/api/v1/persistentvolumeclaims")
    assert status == 200, body
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in json.loads(body)["items"]
    }


def _roles(world: RunbookWorld) -> set[str]:
    return {r["RoleName"] for r in world.aws.client("iam").list_roles()["Roles"]}


def test_down_refuses_while_endpoints_exist(runbook_world: RunbookWorld) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    mark = scenario.mark()
    result = scenario.hpkv("down", "--cluster", "demo", "--yes")
    assert result.exit_code == 1, result
    (line,) = _error_lines(result.stderr)
    assert "planning stage operator failed: 1 InferenceEndpointConfig(s) still exist" in line
    assert scenario.writes_since(mark) == []


def test_down_removes_in_reverse_order_and_keeps_data_volumes_and_roles(
    runbook_world: RunbookWorld,
) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    delete_endpoint(runbook_world)
    pvcs = _pvc_names(runbook_world)
    assert f"{ENDPOINT_NAMESPACE}/{L2_PVC}" in pvcs and len(pvcs) == 3

    refused = scenario.hpkv("down", "--cluster", "demo")
    assert refused.exit_code == 2
    assert "refusing to remove" in _error_lines(refused.stderr)[0]
    result = scenario.hpkv("down", "--cluster", "demo", "--yes")
    assert result.exit_code == 0, result
    removing = [line for line in result.stderr.splitlines() if ": removing " in line]
    assert [line.split(":")[0] for line in removing] == [
        "[1/4] l2",
        "[2/4] curvine",
        "[3/4] operator",
        "[4/4] tiered-storage",
    ]
    out = result.stdout
    assert f"kept: L2 PVC {ENDPOINT_NAMESPACE}/{L2_PVC} and its cached KV blocks" in out
    assert "kept: the master's metadata/journal volumes" in out
    assert "kept: IAM roles SageMakerHyperPodInference-demo" in out
    assert "Enable at 20% -> Disable" in out
    # nothing that holds data, and no IAM role, was deleted; the rest is gone
    assert _pvc_names(runbook_world) == pvcs
    assert _roles(runbook_world) >= ROLES
    eks = runbook_world.aws.extensions["eks"]
    assert [name for (_c, name) in eks.addons] == ["aws-ebs-csi-driver"]  # shared, kept
    assert scenario.sagemaker.clusters["demo"].tiered_storage == {"Mode": "Disable"}
    status, body = runbook_world.kube.raw(
        "GET", f"/api/v1/namespaces/{CURVINE_NAMESPACE}/secrets?labelSelector=owner%3Dhelm"
    )
    assert status == 200 and json.loads(body)["items"] == []  # both Helm releases uninstalled


def test_down_with_flags_deletes_data_volumes_and_roles_after_listing_them(
    runbook_world: RunbookWorld,
) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    delete_endpoint(runbook_world)
    flags = ("--delete-data", "--delete-volumes", "--delete-iam")
    dry = scenario.hpkv("down", "--cluster", "demo", *flags, "--dry-run", "-o", "json")
    assert dry.exit_code == 0, dry
    plans = {s["stage"]: s["plan"] for s in json.loads(dry.stdout)["stages"]}
    destructive = {
        (stage, a["target"]) for stage, p in plans.items() for a in p["actions"] if a["destructive"]
    }
    assert ("curvine", f"PersistentVolumeClaim/{ENDPOINT_NAMESPACE}/{L2_PVC}") in destructive
    assert ("curvine", "PersistentVolumeClaim/curvine/meta-curvine-master-0") in destructive
    assert ("operator", "s3 bucket/hyperpod-tls-demo-123456789012") in destructive
    # only the shared EBS CSI add-on stays; the operator keeps nothing with --delete-iam
    (kept,) = plans["curvine"]["kept"]
    assert "aws-ebs-csi-driver" in kept
    assert "kept" not in plans["operator"] and "kept" not in plans["l2"]

    result = scenario.hpkv("down", "--cluster", "demo", *flags, "--yes")
    assert result.exit_code == 0, result
    assert _pvc_names(runbook_world) == set()
    assert not ROLES & _roles(runbook_world)
    assert "warning:" not in result.stderr  # every flag is honoured by some stage


def test_down_on_a_terminal_lists_the_removals_and_what_stays_before_asking(
    runbook_world: RunbookWorld,
) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    assert scenario.hpkv("up", "--cluster", "demo", *STAGE1, "--yes").exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    status, output = run_on_tty(["down", "--cluster", "demo"], [(b"[y/N]", b"n")], env)
    assert status == 1, output
    removal = output.index("hpkv down will remove:")
    assert "tiered-storage: sagemaker cluster/demo TieredStorageConfig" in output[removal:]
    keep = output.index("and keep:")
    assert "curvine: the EKS add-on aws-ebs-csi-driver" in output[keep:]
    assert removal < keep < output.index("Remove 1 change(s)?")
    assert scenario.sagemaker.clusters["demo"].tiered_storage["Mode"] == "Enable"


def test_up_waits_for_a_cluster_still_updating_from_an_interrupted_run(
    runbook_world: RunbookWorld,
) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    # Updating for more DescribeCluster calls than 'up' makes before stage 1 plans (it also reads
    # the cluster to find the EKS API), so the plan meets the update in progress.
    scenario.sagemaker.update_describes = 8
    # An earlier run's UpdateCluster went through, then the process died.
    scenario.aws.client("sagemaker").update_cluster(
        ClusterName="demo",
        TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20},
        NodeRecovery="Automatic",
    )
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", *STAGE1, "--yes")
    assert result.exit_code == 0, result
    assert "waiting for cluster demo to be InService (Updating)" in result.stderr
    assert scenario.writes_since(mark) == []


# --- stage 5: up --bench --------------------------------------------------------------------------
@pytest.fixture
def bench_endpoint(scenario: Scenario, shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An endpoint whose pods are fake vLLM servers, with the Job controller and kubelet played."""
    from tests.harness.bench import MEASURED_COSTS, JobPlayer, install_endpoint_crd, play_endpoint

    scenario.hyperpod(node_recovery="Automatic")
    install_endpoint_crd(scenario.kube, shared_dir)
    logs = scenario.workdir / "pod-logs"
    endpoint = play_endpoint(scenario.kube, shared_dir, logs, costs=MEASURED_COSTS)
    monkeypatch.setenv("HPKV_INCLUSTER_ROUTES", json.dumps(endpoint.routes))
    monkeypatch.setenv("HPKV_POD_LOGS_DIR", str(logs))
    monkeypatch.setenv("HPKV_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("HPKV_BENCH__RESULTS_DIR", str(scenario.workdir / "results"))
    router = (
        f"{endpoint.name}-routing-service.{endpoint.namespace}.svc.cluster.local:443",
        f"127.0.0.1:{endpoint.cluster.router_port}",
    )
    with JobPlayer(scenario.kube, endpoint.log_dir, router=router) as kubelet:
        yield endpoint
    assert not kubelet.errors, kubelet.errors
    endpoint.cluster.stop()


def test_up_bench_runs_the_cross_pod_benchmark_and_saves_the_result(
    scenario: Scenario, bench_endpoint: Any
) -> None:
    dry = scenario.hpkv("up", "--cluster", "demo", "--from", "bench", "--dry-run")
    assert dry.exit_code == 0, dry
    assert "stage 1/1: bench:" in dry.stdout and "bench default/demo" in dry.stdout

    result = scenario.hpkv("up", "--cluster", "demo", "--from", "bench", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    (stage,) = json.loads(result.stdout)["stages"]
    assert stage["state"] == "applied"
    (check,) = stage["result"]["checks"]
    assert check["name"] == "bench default/demo" and check["state"] == "ok", check
    assert "cross-pod hit rate" in check["evidence"]
    saved = list((scenario.workdir / "results").glob("*/result.json"))
    assert len(saved) == 1 and str(saved[0]) in check["evidence"]
    from hpkv.bench import results

    doc = results.load(saved[0])
    assert [s["name"] for s in doc["scenarios"]] == ["cross-pod"]
    # the runner's ConfigMap and Job are gone: nothing is left in the cluster
    assert not [
        k for k in scenario.kube.inventory() if k[1] in ("jobs", "configmaps") and k[2] == "default"
    ]
    status = scenario.hpkv("status", "--cluster", "demo", "--stage", "bench", "-o", "json")
    assert str(saved[0]) in status.stdout
