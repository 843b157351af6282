"""`hpkv up` / `hpkv down` through the CLI: the combined plan, one confirmation, per-stage progress
on stderr and data on stdout, stopping at a failed stage with its findings, resuming."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from hpkv.stages.base import Check, CheckState
from tests.harness.cli import run_on_tty
from tests.harness.runbook import fresh_cluster
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]

REPO = Path(__file__).resolve().parents[2]


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("hpkv: error: ")]


def test_up_shows_plan_then_applies_with_progress_on_stderr(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    result = scenario.hpkv("up", "--cluster", "demo", "--yes")
    assert result.exit_code == 0, result
    out = result.stdout
    assert out.index("stage 1/1: tiered-storage") < out.index("plan: tiered-storage")
    assert "not configured -> Enable at 20%" in out
    assert "1 change(s) in 1 stage(s)" in out
    assert "applied" in out and "ai-toolkit-daemonset ok" in out
    progress = result.stderr.splitlines()
    assert progress[:3] == [
        "[1/1] tiered-storage: planning",
        "[1/1] tiered-storage: 1 change(s) planned",
        "[1/1] tiered-storage: applying 1 change(s)",
    ]
    assert progress[-1] == "[1/1] tiered-storage: done, 1 change(s) made, verification ok"
    assert "[1/1]" not in out  # progress never on stdout
    assert "\x1b[" not in result.stderr  # plain lines without a terminal


def test_up_json_is_one_document_on_stdout(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    result = scenario.hpkv("up", "--cluster", "demo", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    payload = json.loads(result.stdout)
    assert payload["command"] == "up" and payload["applied"] is True
    assert payload["failed"] is None and payload["changes"] == 1
    (stage,) = payload["stages"]
    assert stage["state"] == "applied"
    assert stage["plan"]["actions"][0]["after"]["Mode"] == "Enable"
    assert stage["result"]["checks"][0]["state"] == "ok"
    assert "[1/1] tiered-storage: applying 1 change(s)" in result.stderr


def test_up_without_tty_or_yes_refuses_and_changes_nothing(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo")
    assert result.exit_code == 2
    (line,) = _error_lines(result.stderr)
    assert "refusing to apply 1 change(s) without confirmation" in line and "--yes" in line
    assert "plan: tiered-storage" in result.stdout
    assert scenario.writes_since(mark) == []


def test_up_dry_run_changes_nothing(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--dry-run", "-o", "json")
    assert result.exit_code == 0, result
    payload = json.loads(result.stdout)
    assert payload["dryRun"] is True and payload["applied"] is False
    assert payload["stages"][0]["state"] == "planned"
    assert scenario.writes_since(mark) == []


@pytest.mark.parametrize(("answer", "code", "writes"), [("n", 1, 0), ("y", 0, 1)])
def test_up_on_a_terminal_asks_once(
    scenario: Scenario, answer: str, code: int, writes: int
) -> None:
    fresh_cluster(scenario)
    mark = scenario.mark()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("NO_COLOR", None)
    status, output = run_on_tty(["up", "--cluster", "demo"], [(b"[y/N]", answer.encode())], env)
    assert status == code, output
    assert output.count("[y/N]") == 1
    assert "Apply 1 change(s)?" in output
    made = [w for w in scenario.writes_since(mark) if "UpdateCluster" in w]
    assert len(made) == writes
    if answer == "y":
        assert "1/1 tiered-storage" in output  # the rich stage rule
        assert "✓ [1/1] tiered-storage: done" in output


def test_failed_stage_prints_findings_and_a_rerun_continues(scenario: Scenario) -> None:
    # HyperPod accepts the update but never deploys the ai-toolkit DaemonSet: verification fails.
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(2)
    result = scenario.hpkv("up", "--cluster", "demo", "--yes", "--timeout", "1s")
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
    again = scenario.hpkv("up", "--cluster", "demo", "--yes", "-o", "json")
    assert again.exit_code == 0, again
    assert scenario.writes_since(mark) == []
    assert json.loads(again.stdout)["stages"][0]["state"] == "converged"


def test_failure_json_names_the_stage_and_its_findings(scenario: Scenario) -> None:
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(1)
    result = scenario.hpkv("up", "--cluster", "demo", "--yes", "--timeout", "1s", "-o", "json")
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["failed"] == "tiered-storage"
    stage = payload["stages"][0]
    assert stage["state"] == "failed" and "DaemonSet" in stage["error"]
    assert {f["name"] for f in stage["findings"]} == {"ai-toolkit-daemonset"}


def test_findings_come_from_the_diagnose_module_when_present(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpkv.diagnose.findings_for_stage(ctx, stage_name) -> list[Check]` (issue 7) is used."""
    module = types.ModuleType("hpkv.diagnose")
    module.findings_for_stage = lambda ctx, name: [  # type: ignore[attr-defined]
        Check("ai-toolkit-pods", CheckState.FAIL, "0/1 pods scheduled", "add capacity", name)
    ]
    monkeypatch.setitem(sys.modules, "hpkv.diagnose", module)
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(1)
    result = scenario.hpkv("up", "--cluster", "demo", "--yes", "--timeout", "1s")
    assert result.exit_code == 1
    assert "ai-toolkit-pods" in result.stdout and "0/1 pods scheduled" in result.stdout


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


def test_down_lists_what_it_removes_and_keeps_reverse_order(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    refused = scenario.hpkv("down", "--cluster", "demo")
    assert refused.exit_code == 2
    assert "refusing to remove 1 change(s)" in _error_lines(refused.stderr)[0]
    result = scenario.hpkv("down", "--cluster", "demo", "--yes", "--delete-iam")
    assert result.exit_code == 0, result
    assert "Enable at 20% -> Disable" in result.stdout
    assert "warning: --delete-iam: no stage in this run deletes that" in result.stderr
    assert "[1/1] tiered-storage: removing 1 change(s)" in result.stderr
    assert scenario.sagemaker.clusters["demo"].tiered_storage == {"Mode": "Disable"}
    assert scenario.kube.get_object("apps/v1", "DaemonSet", "ai-toolkit", "aws-hyperpod") is None


def test_down_on_a_terminal_lists_the_removals_before_asking(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    status, output = run_on_tty(["down", "--cluster", "demo"], [(b"[y/N]", b"n")], env)
    assert status == 1, output
    removal = output.index("hpkv down will remove:")
    assert "tiered-storage: sagemaker cluster/demo TieredStorageConfig" in output[removal:]
    assert removal < output.index("Remove 1 change(s)?")
    assert scenario.sagemaker.clusters["demo"].tiered_storage["Mode"] == "Enable"


def test_up_waits_for_a_cluster_still_updating_from_an_interrupted_run(
    scenario: Scenario,
) -> None:
    fresh_cluster(scenario)
    scenario.sagemaker.update_describes = 3
    # An earlier run's UpdateCluster went through, then the process died.
    scenario.aws.client("sagemaker").update_cluster(
        ClusterName="demo",
        TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20},
        NodeRecovery="Automatic",
    )
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--yes")
    assert result.exit_code == 0, result
    assert "waiting for cluster demo to be InService (Updating)" in result.stderr
    assert scenario.writes_since(mark) == []
