"""Idempotency audit: `hpkv up` twice on a converged cluster makes zero mutating AWS, Kubernetes
or Helm calls (Helm's release records are Kubernetes writes, so the audit log counts them too),
and its combined plan is all `none`. Parametrized over the stage registry."""

from __future__ import annotations

import json

import pytest

from tests.harness.runbook import (
    COUNTS,
    RunbookWorld,
    delete_endpoint,
    end_state,
    fresh_cluster,
    harness_for,
    helm_revisions,
    runbook_stages,
    state_differences,
)

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def _audit_second_up(world: RunbookWorld, *args: str) -> dict:
    scenario = world.scenario
    converged = end_state(world)
    helm = helm_revisions(world)
    mark = scenario.mark()
    again = scenario.hpkv("up", "--cluster", "demo", *args, "--yes", "-o", "json")
    writes = scenario.writes_since(mark)
    COUNTS["idempotency.runs"] += 1
    COUNTS["idempotency.writes"] += len(writes)
    assert again.exit_code == 0, again
    assert writes == []
    assert helm_revisions(world) == helm  # no helm upgrade either
    payload = json.loads(again.stdout)
    assert payload["changes"] == 0
    for entry in payload["stages"]:
        assert entry["state"] == "converged", entry
        assert {a["verb"] for a in entry["plan"]["actions"]} == {"none"}, entry["plan"]
    after = end_state(world)
    assert after == converged, state_differences(after, converged)
    return payload


@pytest.mark.parametrize("stage", runbook_stages()[:-1])
def test_second_up_through_each_stage_makes_zero_writes(
    runbook_world: RunbookWorld, stage: str
) -> None:
    """The last stage is covered by the full run below."""
    harness_for(stage)
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    mark = scenario.mark()
    first = scenario.hpkv("up", "--cluster", "demo", "--through", stage, "--yes")
    assert first.exit_code == 0, first
    assert scenario.writes_since(mark), "the first run must change the fresh cluster"
    _audit_second_up(runbook_world, "--through", stage)


def test_second_full_up_makes_zero_writes_then_dry_run_shows_only_none(
    runbook_world: RunbookWorld,
) -> None:
    for stage in runbook_stages():
        harness_for(stage)
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    first = scenario.hpkv("up", "--cluster", "demo", "--yes")
    assert first.exit_code == 0, first
    payload = _audit_second_up(runbook_world)
    assert [s["stage"] for s in payload["stages"]] == runbook_stages()

    mark = scenario.mark()
    result = scenario.hpkv("up", "--cluster", "demo", "--dry-run")
    assert result.exit_code == 0, result
    assert f"0 change(s) in {len(runbook_stages())} stage(s)" in result.stdout
    assert "nothing to do, already in the desired state" in result.stdout
    assert "dry run: nothing was changed" in result.stdout
    assert scenario.writes_since(mark) == []


def test_second_down_makes_zero_writes(runbook_world: RunbookWorld) -> None:
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    assert scenario.hpkv("up", "--cluster", "demo", "--yes").exit_code == 0
    delete_endpoint(runbook_world)  # 'hpkv down' refuses while endpoints exist
    down = scenario.hpkv("down", "--cluster", "demo", "--yes")
    assert down.exit_code == 0, down
    mark = scenario.mark()
    again = scenario.hpkv("down", "--cluster", "demo", "--yes")
    assert again.exit_code == 0, again
    writes = scenario.writes_since(mark)
    COUNTS["idempotency.runs"] += 1
    COUNTS["idempotency.writes"] += len(writes)
    assert writes == []
