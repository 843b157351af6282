"""What the runbook suites (resilience, idempotency) need to know about each registered stage.

Every stage in ``hpkv.stages.STAGES`` needs a :class:`StageHarness` in :data:`STAGE_HARNESSES`;
the suites are parametrized over the registry and fail for a stage that has none. A harness says
how to make ``hpkv up`` succeed for the stage on the test cluster (which controllers the test
plays), what the stage's end state is, which API calls to inject faults into, and which
data-loss invariants must hold after an interrupted run is resumed.

FOLLOW-UP (stages 2-4): add a StageHarness each. The invariants the issue names go in
``invariants``: operator (stage 2) - the operator Deployment's replica count is restored;
curvine (stage 3) - Curvine is never reformatted (format flags off after the first install, the
master's journal/meta PVCs keep their UIDs) and no PVC is deleted; l2 (stage 4) - no PVC deleted,
the vLLM Deployments keep one LMCACHE_REMOTE_URL. ``snapshot`` should include helm release
revisions so a resumed run is seen not to upgrade twice.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.harness.scenario import Scenario

# Counts printed at the end of the test session (tests/conftest.py pytest_terminal_summary).
COUNTS: Counter[str] = Counter()


def no_invariants(scenario: Scenario, reference: dict[str, Any], resumed: dict[str, Any]) -> None:
    """Stages whose resources hold no user data have no invariant beyond equal end states."""
    return None


@dataclass(frozen=True)
class StageHarness:
    name: str
    # Plays what the stage needs from AWS/Kubernetes controllers on the fresh test cluster.
    prepare: Callable[[Scenario], None]
    # The stage's end state, compared between an uninterrupted run and an interrupted + resumed
    # one (the Kubernetes inventory is compared for every stage in addition).
    snapshot: Callable[[Scenario], dict[str, Any]]
    # "service:Action" calls the stage makes during 'up' (a test checks the list is complete).
    aws_actions: tuple[str, ...]
    # (method, path regex) of the stage's Kubernetes requests during 'up'.
    kube_requests: tuple[tuple[str, str], ...]
    # Data-loss checks: raise AssertionError when a resumed run lost or rewrote data.
    invariants: Callable[[Scenario, dict[str, Any], dict[str, Any]], None] = no_invariants


# --- stage 1: tiered storage ---------------------------------------------------------------------
def _tiered_prepare(scenario: Scenario) -> None:
    scenario.play_hyperpod_tiered_storage()


def _tiered_snapshot(scenario: Scenario) -> dict[str, Any]:
    cluster = scenario.sagemaker.clusters[scenario.cluster_name]
    accepted = [r for r in cluster.update_requests if "TieredStorageConfig" in r]
    return {
        "tieredStorage": cluster.tiered_storage,
        "nodeRecovery": cluster.node_recovery,
        "status": cluster.status,
        # each accepted UpdateCluster changed the cluster once: a duplicate would show here
        "updates": [{k: v for k, v in r.items() if k != "ClusterName"} for r in accepted],
    }


def _tiered_invariants(
    scenario: Scenario, reference: dict[str, Any], resumed: dict[str, Any]
) -> None:
    # NodeRecovery is never changed, InstanceGroups never sent (they hold the nodes)
    assert resumed["nodeRecovery"] == reference["nodeRecovery"]
    assert all("InstanceGroups" not in u for u in resumed["updates"]), resumed["updates"]


TIERED_STORAGE = StageHarness(
    name="tiered-storage",
    prepare=_tiered_prepare,
    snapshot=_tiered_snapshot,
    aws_actions=("sagemaker:DescribeCluster", "sagemaker:UpdateCluster", "eks:DescribeCluster"),
    kube_requests=(
        ("GET", r"^/api/v1/?$"),
        ("GET", r"^/api/v1/nodes$"),
        ("GET", r"/daemonsets/ai-toolkit$"),
        ("GET", r"/namespaces/aws-hyperpod/pods$"),
    ),
    invariants=_tiered_invariants,
)

STAGE_HARNESSES: dict[str, StageHarness] = {h.name: h for h in (TIERED_STORAGE,)}


def harness_for(stage: str) -> StageHarness:
    import pytest

    harness = STAGE_HARNESSES.get(stage)
    if harness is None:
        pytest.fail(
            f"stage '{stage}' is registered in hpkv.stages.STAGES but has no StageHarness: add one "
            "to STAGE_HARNESSES in tests/harness/runbook.py (prepare, snapshot, fault targets, "
            "invariants) so the resilience suite covers it"
        )
    return harness


# --- the cluster every runbook test starts from --------------------------------------------------
def fresh_cluster(scenario: Scenario, *, nodes: int = 2) -> None:
    """HyperPod cluster 'demo' with GPU nodes and nothing installed; controllers played for every
    registered stage."""
    from hpkv.stages import stage_names

    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(nodes)
    for name in stage_names():
        if name in STAGE_HARNESSES:
            STAGE_HARNESSES[name].prepare(scenario)


def end_state(scenario: Scenario) -> dict[str, Any]:
    """Every stage's snapshot plus the Kubernetes inventory (objects beyond the baseline)."""
    from hpkv.stages import stage_names

    state: dict[str, Any] = {
        name: STAGE_HARNESSES[name].snapshot(scenario)
        for name in stage_names()
        if name in STAGE_HARNESSES
    }
    state["kubernetes"] = sorted(scenario.kube.inventory())
    return state


def reset(scenario: Scenario) -> None:
    """Back to an empty AWS emulator and apiserver (between iterations inside one test)."""
    scenario.aws.reset()
    scenario.kube.reset()
    scenario.node_names.clear()


_HEADER = re.compile(r"^\[(\d+)/(\d+)\] ([a-z0-9-]+): ")


def stage_of_lines(lines: list[str], first: str) -> list[str]:
    """The stage each progress line belongs to (lines without a header: the previous stage's)."""
    owners, current = [], first
    for line in lines:
        match = _HEADER.match(line)
        if match:
            current = match.group(3)
        owners.append(current)
    return owners


def summary_lines(counts: Counter[str]) -> list[str]:
    """The lines the test session prints at its end (only for the suites that ran)."""
    lines = []
    faults = counts["faults.aws"] + counts["faults.kube"]
    if faults or counts["faults.kill"]:
        lines.append(
            f"resilience: {faults} faults injected (AWS {counts['faults.aws']}, Kubernetes "
            f"{counts['faults.kube']}), {counts['faults.kill']} processes killed at step "
            f"boundaries; {counts['resume.writes']} writes made by {counts['resume.runs']} re-runs"
        )
    if counts["inputs"]:
        lines.append(f"bad input: {counts['inputs']} malformed inputs tried")
    if counts["idempotency.runs"]:
        lines.append(
            f"idempotency: {counts['idempotency.writes']} mutating calls on second runs of "
            f"'hpkv up'/'hpkv down' ({counts['idempotency.runs']} audited)"
        )
    return lines
