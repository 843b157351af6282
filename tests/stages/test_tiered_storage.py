"""Stage 1 core behaviour: plans, waits, the NodeRecovery rule, remove, and status states."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def _status(scenario: Scenario) -> dict[str, dict]:
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    return {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def test_status_when_not_installed_reads_not_installed(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.nodes(2)
    checks = _status(scenario)
    assert checks["tiered-storage"]["state"] == "warn"
    assert checks["tiered-storage"]["evidence"].startswith("not installed")
    assert checks["ai-toolkit-daemonset"]["state"] == "ok"
    assert "absent" in checks["ai-toolkit-daemonset"]["evidence"]


def test_status_percentage_drift_and_missing_daemonset(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 50})
    scenario.nodes(1)
    checks = _status(scenario)
    assert checks["tiered-storage"]["state"] == "warn"
    assert "hpkv.yaml asks for 20%" in checks["tiered-storage"]["evidence"]
    assert checks["ai-toolkit-daemonset"]["state"] == "fail"


def test_remove_disables_with_node_recovery_and_waits_for_daemonset_to_go(
    scenario: Scenario,
) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    scenario.nodes(2)
    scenario.ai_toolkit()
    scenario.play_hyperpod_tiered_storage()
    result = scenario.hpkv("tiered-storage", "remove", "--cluster", "demo", "--yes")
    assert result.exit_code == 0, result
    request = scenario.sagemaker.clusters["demo"].update_requests[-1]
    assert request["TieredStorageConfig"] == {"Mode": "Disable"}
    assert request["NodeRecovery"] == "Automatic"
    assert scenario.kube.get_object("apps/v1", "DaemonSet", "ai-toolkit", "aws-hyperpod") is None

    mark = scenario.mark()
    again = scenario.hpkv("tiered-storage", "remove", "--cluster", "demo", "--yes")
    assert again.exit_code == 0
    assert scenario.writes_since(mark) == []


def test_refuses_when_cluster_is_not_in_service(scenario: Scenario) -> None:
    scenario.hyperpod(status="Updating")
    scenario.sagemaker.clusters["demo"].pending_describes = 10**6
    mark = scenario.mark()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes")
    assert result.exit_code == 1
    assert "is Updating, not InService" in result.stderr and "--wait" in result.stderr
    assert scenario.writes_since(mark) == []


def test_wait_waits_for_in_service_before_updating(scenario: Scenario) -> None:
    scenario.hyperpod(status="Updating")
    scenario.sagemaker.clusters["demo"].pending_describes = 2  # InService on the third describe
    scenario.nodes(1)
    scenario.play_hyperpod_tiered_storage()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes", "--wait")
    assert result.exit_code == 0, result
    assert scenario.sagemaker.clusters["demo"].tiered_storage["Mode"] == "Enable"


def test_missing_node_recovery_is_refused_before_any_write(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery=None)
    mark = scenario.mark()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes")
    assert result.exit_code == 1
    assert "reports no NodeRecovery" in result.stderr and "--node-recovery" in result.stderr
    assert scenario.writes_since(mark) == []


def test_apply_waits_until_daemonset_is_ready_on_every_node(scenario: Scenario) -> None:
    scenario.hyperpod()
    nodes = scenario.nodes(2)
    scenario.sagemaker.update_describes = 2

    def deploy_slowly(cluster: object) -> None:
        scenario.ai_toolkit(ready_nodes=nodes[:1])

        def finish() -> None:
            time.sleep(0.5)
            scenario.ai_toolkit(ready_nodes=nodes)

        threading.Thread(target=finish, daemon=True).start()

    scenario.sagemaker.on_in_service.append(deploy_slowly)
    started = time.monotonic()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    assert time.monotonic() - started >= 0.5
    check = json.loads(result.stdout)["results"][0]["checks"][0]
    assert check["state"] == "ok" and "ready 2" in check["evidence"]


def test_apply_times_out_when_daemonset_never_becomes_ready(scenario: Scenario) -> None:
    scenario.hyperpod()
    nodes = scenario.nodes(2)
    scenario.sagemaker.on_in_service.append(
        lambda cluster: scenario.ai_toolkit(ready_nodes=nodes[:1])
    )
    result = scenario.hpkv(
        "tiered-storage", "apply", "--cluster", "demo", "--yes", "--timeout", "2s"
    )
    assert result.exit_code == 1
    assert "was not ready on every HyperPod node within 2s" in result.stderr
    assert nodes[1] in result.stderr


def test_no_wait_returns_after_the_update(scenario: Scenario) -> None:
    scenario.hyperpod()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes", "--no-wait")
    assert result.exit_code == 0, result
    assert "not waiting (--no-wait)" in result.stdout
    assert scenario.sagemaker.clusters["demo"].status == "Updating"


def test_config_file_percentage_is_used(scenario: Scenario) -> None:
    scenario.hyperpod()
    scenario.nodes(1)
    scenario.play_hyperpod_tiered_storage()
    (scenario.workdir / "hpkv.yaml").write_text(
        "cluster: demo\ntieredStorage:\n  memoryPercent: 45\n"
    )
    result = scenario.hpkv("tiered-storage", "apply", "--yes")
    assert result.exit_code == 0, result
    assert (
        scenario.sagemaker.clusters["demo"].tiered_storage["InstanceMemoryAllocationPercentage"]
        == 45
    )
