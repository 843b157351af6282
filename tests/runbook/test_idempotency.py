"""Idempotency audit: `hpkv up` twice on a converged cluster makes zero mutating AWS, Kubernetes
or Helm calls (Helm's release records are Kubernetes writes, so the audit log counts them too),
and its combined plan is all `none`. Parametrized over the stage registry."""

from __future__ import annotations

import json

import pytest

from hpkv.stages import stage_names
from tests.harness.runbook import COUNTS, end_state, fresh_cluster, harness_for
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


@pytest.mark.parametrize("stage", stage_names())
def test_second_up_through_each_stage_makes_zero_writes(scenario: Scenario, stage: str) -> None:
    harness_for(stage)
    fresh_cluster(scenario)
    mark = scenario.mark()
    first = scenario.hpkv("up", "--cluster", "demo", "--through", stage, "--yes")
    assert first.exit_code == 0, first
    assert scenario.writes_since(mark), "the first run must change the fresh cluster"
    converged = end_state(scenario)

    mark = scenario.mark()
    again = scenario.hpkv("up", "--cluster", "demo", "--through", stage, "--yes", "-o", "json")
    writes = scenario.writes_since(mark)
    COUNTS["idempotency.runs"] += 1
    COUNTS["idempotency.writes"] += len(writes)
    assert again.exit_code == 0, again
    assert writes == []
    payload = json.loads(again.stdout)
    assert payload["changes"] == 0
    for entry in payload["stages"]:
        assert entry["state"] == "converged", entry
        assert {a["verb"] for a in entry["plan"]["actions"]} == {"none"}, entry["plan"]
    assert end_state(scenario) == converged


def test_dry_run_on_a_converged_cluster_shows_only_none(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--dry-run")
    assert result.exit_code == 0, result
    assert "0 change(s) in" in result.stdout
    assert "nothing to do, already in the desired state" in result.stdout
    assert "dry run: nothing was changed" in result.stdout
    assert scenario.writes_since(mark) == []


def test_second_down_makes_zero_writes(scenario: Scenario) -> None:
    fresh_cluster(scenario)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    down = scenario.hpkv("down", "--cluster", "demo", "--yes")
    assert down.exit_code == 0, down
    mark = scenario.mark()
    again = scenario.hpkv("down", "--cluster", "demo", "--yes")
    assert again.exit_code == 0, again
    writes = scenario.writes_since(mark)
    COUNTS["idempotency.runs"] += 1
    COUNTS["idempotency.writes"] += len(writes)
    assert writes == []
