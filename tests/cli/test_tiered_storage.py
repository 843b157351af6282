"""`hpkv tiered-storage status|apply|remove` against the AWS emulator and the real kube-apiserver."""

from __future__ import annotations

import json

import pytest

from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def test_apply_enables_then_second_apply_makes_zero_writes(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(2)
    scenario.play_hyperpod_tiered_storage()

    mark = scenario.mark()
    result = scenario.hpkv(
        "tiered-storage", "apply", "--cluster", "demo", "--memory-percent", "30", "--yes"
    )
    assert result.exit_code == 0, result
    assert "applied 1 change(s)" in result.stdout
    writes = scenario.writes_since(mark)
    assert writes == ["sagemaker:UpdateCluster -> 200"], writes
    request = scenario.sagemaker.clusters["demo"].update_requests[-1]
    assert request["TieredStorageConfig"] == {
        "Mode": "Enable",
        "InstanceMemoryAllocationPercentage": 30,
    }
    assert request["NodeRecovery"] == "Automatic"
    assert "InstanceGroups" not in request

    mark = scenario.mark()
    again = scenario.hpkv(
        "tiered-storage", "apply", "--cluster", "demo", "--memory-percent", "30", "--yes"
    )
    assert again.exit_code == 0, again
    assert "nothing to do" in again.stdout
    assert scenario.writes_since(mark) == []


def test_apply_sends_node_recovery_none_back(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery="None")
    scenario.nodes(1)
    scenario.play_hyperpod_tiered_storage()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "demo", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    request = scenario.sagemaker.clusters["demo"].update_requests[-1]
    assert request["NodeRecovery"] == "None"
    assert request["TieredStorageConfig"] == {
        "Mode": "Enable",
        "InstanceMemoryAllocationPercentage": 20,
    }
    payload = json.loads(result.stdout)
    assert payload["applied"] is True
    assert payload["results"][0]["checks"][0]["state"] == "ok"


def test_status_reports_daemonset_nodes_lacking_it(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    nodes = scenario.nodes(3)
    scenario.ai_toolkit(ready_nodes=nodes[:2])
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 1, result  # WARNING
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["tiered-storage"]["state"] == "ok"
    assert checks["ai-toolkit-daemonset"]["state"] == "warn"
    assert nodes[2] in checks["ai-toolkit-daemonset"]["evidence"]
    assert "desired 3, ready 2" in checks["ai-toolkit-daemonset"]["evidence"]


def test_bad_percentage_is_a_usage_error(scenario: Scenario) -> None:
    result = scenario.hpkv("tiered-storage", "apply", "--memory-percent", "10", "--cluster", "demo")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "20..100" in lines[0]


def test_missing_cluster_is_one_line(scenario: Scenario) -> None:
    scenario.hyperpod()
    result = scenario.hpkv("tiered-storage", "apply", "--cluster", "nope", "--yes")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "HyperPod cluster 'nope' not found" in lines[0]
    assert "Fix:" in lines[0]
