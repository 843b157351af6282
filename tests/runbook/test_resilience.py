"""Resilience of `hpkv up` over every stage: AWS throttling, 5xx and timeouts (botocore's retry
modes), Kubernetes 409/429/500 responses, and a process killed with SIGKILL at every step boundary.
After each, a re-run converges to the same end state as an undisturbed run, with no duplicate
resources and no data lost, and with no manual cleanup. A stage's fault targets and data-loss
invariants live in its StageHarness (tests/harness/runbook.py).

To keep the suite's time reasonable each test drives one whole `hpkv up` over all the stages:
transient faults are injected into every stage's calls at once (one test per fault kind), a fault
that stops a stage is injected into each stage in turn (each run resumes the previous stage's
work and stops at the next), and the process is killed once at every step boundary of a full `up`
(each run continues where the previous one was killed and is killed at the first boundary no
earlier run was killed at).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.aws import Fault
from tests.harness.aws.server import READ_PREFIXES
from tests.harness.kube_proxy import KubeFault, KubeProxy
from tests.harness.runbook import (
    COUNTS,
    STAGE_HARNESSES,
    RunbookWorld,
    _format_flags,
    _pvcs,
    end_state,
    fresh_cluster,
    harness_for,
    reset,
    runbook_stages,
    state_differences,
)

pytestmark = [pytest.mark.kube, pytest.mark.aws]

REPO = Path(__file__).resolve().parents[2]
AWS_KINDS = ("throttle", "server", "unavailable", "timeout")
KUBE_STATUSES = (429, 500)

# The end state of an undisturbed `hpkv up` on the fresh cluster (computed once per session).
_REFERENCE: dict[str, dict[str, Any]] = {}


def _harnesses() -> list[Any]:
    return [harness_for(stage) for stage in runbook_stages()]


def _up(world: RunbookWorld) -> Any:
    return world.scenario.hpkv("up", "--cluster", "demo", "--yes")


def _reference(world: RunbookWorld) -> dict[str, Any]:
    """The end state of an undisturbed full `up`; also checks that each harness lists every AWS
    action its stage calls (so the fault tests reach all of them)."""
    if "up" not in _REFERENCE:
        scenario = world.scenario
        fresh_cluster(world)
        listed = {a for h in _harnesses() for a in h.aws_actions}
        mark = scenario.mark()
        result = _up(world)
        assert result.exit_code == 0, result
        called = {f"{c.service}:{c.action}" for c in scenario.aws.calls_since(mark[0])}
        assert called <= listed, f"AWS calls no StageHarness lists: {sorted(called - listed)}"
        _REFERENCE["up"] = end_state(world)
        _REFERENCE["lines"] = {"stderr": result.stderr.splitlines()}
        reset(world)
    return _REFERENCE["up"]


def _assert_converged(world: RunbookWorld, reference: dict[str, Any], where: str = "") -> None:
    state = end_state(world)
    if state != reference:
        differing = state_differences(state, reference)
        raise AssertionError(f"{where}: end state differs from an undisturbed run: {differing}")
    for stage in runbook_stages():
        STAGE_HARNESSES[stage].invariants(world, reference[stage], state[stage])


def _assert_one_line_failure(result: Any) -> str:
    assert result.exit_code == 1, result
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("hpkv: error: ")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert "Fix: " in errors[0]
    return errors[0]


def _rerun_converges(world: RunbookWorld, reference: dict[str, Any]) -> None:
    scenario = world.scenario
    mark = scenario.mark()
    again = _up(world)
    COUNTS["resume.runs"] += 1
    COUNTS["resume.writes"] += len(scenario.writes_since(mark))
    assert again.exit_code == 0, again
    _assert_converged(world, reference)


# --- transient faults: retried, `up` succeeds -----------------------------------------------------
def _aws_fault(action: str, kind: str) -> Fault:
    service, name = action.split(":", 1)
    if kind == "timeout":
        # reads: the request is held before the API sees it; writes: the API applies it and the
        # answer comes late, so botocore's retry meets the change it already made
        write = " " in name and not name.startswith(("GET ", "HEAD "))
        write = write or (" " not in name and not name.startswith(READ_PREFIXES))
        return Fault(service, name, kind="late" if write else "delay", times=1, seconds=1.5)
    return Fault(service, name, kind=kind, times=2)


@pytest.mark.parametrize("kind", AWS_KINDS)
def test_transient_aws_faults_in_every_stage(
    runbook_world: RunbookWorld, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Every AWS action every stage calls fails (twice, or answers late once): botocore retries,
    `up` succeeds and reaches the undisturbed end state."""
    reference = _reference(runbook_world)
    fresh_cluster(runbook_world)
    if kind == "timeout":
        monkeypatch.setenv("HPKV_AWS_READ_TIMEOUT", "0.5")
    actions = sorted({a for h in _harnesses() for a in h.aws_actions})
    faults = [runbook_world.aws.inject(_aws_fault(action, kind)) for action in actions]
    before = [f.times for f in faults]
    result = _up(runbook_world)
    COUNTS["faults.aws"] += sum(b - f.times for b, f in zip(before, faults, strict=True))
    missed = [a for a, f in zip(actions, faults, strict=True) if f.times]
    assert result.exit_code == 0, result
    assert not missed, f"never called, so the fault was never injected: {missed}"
    _assert_converged(runbook_world, reference)


@pytest.mark.parametrize("status", KUBE_STATUSES)
def test_transient_kubernetes_faults_in_every_stage(
    runbook_world: RunbookWorld, kube_proxy: KubeProxy, status: int
) -> None:
    """Every Kubernetes request the stages are known to make answers 429/500 twice: retried."""
    reference = _reference(runbook_world)
    fresh_cluster(runbook_world)
    requests = [r for h in _harnesses() for r in h.kube_requests]
    faults = [
        kube_proxy.inject(KubeFault(status, method=m, path=p, times=2, retry_after=0))
        for m, p in requests
    ]
    result = _up(runbook_world)
    COUNTS["faults.kube"] += sum(2 - f.times for f in faults)
    missed = [r for r, f in zip(requests, faults, strict=True) if f.times]
    assert result.exit_code == 0, result
    assert not missed, f"never requested, so the fault was never injected: {missed}"
    _assert_converged(runbook_world, reference)


# --- faults that stop a stage: one line, then a re-run continues ---------------------------------
def _stop_each_stage(
    world: RunbookWorld,
    inject: Callable[[str], Callable[[], int] | None],
    check_line: Callable[[str], None],
) -> None:
    """For each stage in turn: inject a fault that stops it (``inject`` returns a function
    counting the faults it injected, or None when the stage has no such target), run `up` (it
    resumes the previous stage's interrupted work, then stops here), clear the fault. A last run
    converges."""
    reference = _reference(world)
    fresh_cluster(world)
    stopped = []
    for stage in runbook_stages():
        injected = inject(stage)
        if injected is None:
            continue
        mark = world.scenario.mark()
        result = _up(world)
        count = injected()
        assert count, f"stage {stage}: the fault was never injected"
        assert result.exit_code == 1, f"stage {stage} was not stopped: {result}"
        line = _assert_one_line_failure(result)
        assert f"stage {stage} failed" in line, line
        check_line(line)
        if stopped:
            COUNTS["resume.runs"] += 1
            COUNTS["resume.writes"] += len(world.scenario.writes_since(mark))
        stopped.append(stage)
    assert len(stopped) >= 2, stopped
    _rerun_converges(world, reference)


def _last_write(stage: str) -> str | None:
    writes = [
        a
        for a in STAGE_HARNESSES[stage].aws_actions
        if not a.split(":", 1)[1].startswith((*READ_PREFIXES, "GET ", "HEAD "))
    ]
    return writes[-1] if writes else None


def test_persistent_aws_failure_stops_each_stage_and_a_rerun_continues(
    runbook_world: RunbookWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that keeps failing with 500 (botocore gives up after AWS_MAX_ATTEMPTS) stops the
    stage with one line; the next run resumes it."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    aws = runbook_world.aws

    def inject(stage: str) -> Callable[[], int] | None:
        aws.faults.clear()
        action = _last_write(stage)
        if action is None:
            return None
        service, name = action.split(":", 1)
        aws.inject(Fault(service, name, kind="server", times=-1))
        mark = aws.mark()

        def count() -> int:
            calls = [c for c in aws.calls_since(mark) if (c.service, c.action) == (service, name)]
            COUNTS["faults.aws"] += len(calls)
            assert len(calls) in (0, 2), calls  # botocore tried twice, then hpkv stopped
            return len(calls)

        return count

    def check(line: str) -> None:
        assert "InternalFailure" in line

    _stop_each_stage(runbook_world, inject, check)
    aws.faults.clear()


_CONFLICT_TARGETS = {
    # a Kubernetes request each stage makes, answered 409 once (a conflict is not retried); the
    # operator writes nothing to Kubernetes and its verification reads again until ready
    "tiered-storage": ("GET", r"/daemonsets/ai-toolkit$"),
    "curvine": ("PATCH", r"^/apis/storage\.k8s\.io/v1/storageclasses/"),
    "l2": ("PATCH", r"^/apis/admissionregistration\.k8s\.io/v1/mutatingadmissionpolicies/"),
}


def test_kubernetes_conflict_stops_each_stage_and_a_rerun_continues(
    runbook_world: RunbookWorld, kube_proxy: KubeProxy
) -> None:
    def inject(stage: str) -> Callable[[], int] | None:
        target = _CONFLICT_TARGETS.get(stage)
        if target is None:
            return None
        method, path = target
        fault = kube_proxy.inject(KubeFault(409, method=method, path=path, times=1))

        def count() -> int:
            COUNTS["faults.kube"] += 1 - fault.times
            return 1 - fault.times

        return count

    def check(line: str) -> None:
        assert "conflict" in line

    _stop_each_stage(runbook_world, inject, check)


# --- SIGKILL at every step boundary -------------------------------------------------------------
_GENERATED = re.compile(r"-[0-9a-f]{10}-[a-z0-9]{5}\b")
_APPLYING = re.compile(r"^\[\d+/\d+\] [a-z0-9-]+: applying ")


def _boundary(line: str) -> str:
    """A progress line as a step boundary: generated pod names are not part of it."""
    return _GENERATED.sub("-<pod>", line)


def _run_up(
    env: dict[str, str], kill_at: Callable[[str], bool], timeout: float = 180
) -> tuple[list[str], int]:
    """Run `python -m hpkv up` and SIGKILL it (and its children) right after the first stderr
    line ``kill_at`` accepts. Returns the stderr lines seen and the exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpkv", "up", "--cluster", "demo", "--yes"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    lines: list[str] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                lines.append(raw.decode(errors="replace"))
                if kill_at(lines[-1]):
                    os.killpg(proc.pid, signal.SIGKILL)
                    return lines, proc.wait(timeout=30)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"hpkv up did not finish in {timeout}s: {lines}")
        return lines, proc.wait(timeout=30)
    finally:
        proc.stderr.close()


def _assert_nothing_lost(world: RunbookWorld, pvcs: dict[str, str]) -> None:
    """Between interrupted runs: no PVC deleted or recreated, Curvine never formatted, the
    operator's replica count never changed."""
    now = _pvcs(world)
    lost = {k: uid for k, uid in pvcs.items() if now.get(k) != uid}
    assert not lost, f"PVCs deleted or recreated: {lost}"
    pvcs.update(now)
    assert not any(_format_flags(world).values()), _format_flags(world)
    operator = world.kube.get_object(
        "apps/v1",
        "Deployment",
        "hyperpod-inference-controller-manager",
        "hyperpod-inference-system",
    )
    assert operator is None or operator["spec"]["replicas"] == 1


def test_killed_at_every_step_boundary_then_rerun_converges(runbook_world: RunbookWorld) -> None:
    """The step boundaries of an undisturbed `up`: each stage's start, each step (a change about
    to be made) and each wait. Each run is killed right after the first boundary no earlier run
    was killed at; the next run continues from there. Between runs nothing is lost; the run that
    is no longer killed reaches the undisturbed end state. (Planning only reads.)"""
    reference = _reference(runbook_world)
    boundaries = [
        _boundary(line)
        for line in _REFERENCE["lines"]["stderr"]
        if line.startswith(("→ ", "… ")) or _APPLYING.match(line)
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    scenario = runbook_world.scenario
    fresh_cluster(runbook_world)
    killed: list[str] = []
    pvcs: dict[str, str] = {}

    def new_boundary(line: str) -> bool:
        return _boundary(line) in boundaries and _boundary(line) not in killed

    for attempt in range(len(boundaries) + 1):
        scenario.aws.latency = 0.05  # the kill lands while the next call is in flight
        mark = scenario.mark()
        lines, code = _run_up(env, new_boundary)
        scenario.aws.latency = 0.0
        if attempt:
            COUNTS["resume.runs"] += 1
            COUNTS["resume.writes"] += len(scenario.writes_since(mark))
        if code == 0:
            break
        assert code == -signal.SIGKILL, (code, lines)
        COUNTS["faults.kill"] += 1
        killed.append(_boundary(lines[-1]))
        _assert_nothing_lost(runbook_world, pvcs)
    else:
        raise AssertionError(f"still killed after {len(killed)} runs: {killed[-5:]}")
    # every stage's start and most boundaries were reached by some run (a boundary inside a step
    # the previous kill completed, such as its wait, is not printed again)
    applying = [b for b in boundaries if _APPLYING.match(b)]
    assert len(applying) == len(runbook_stages()) and set(applying) <= set(killed), killed
    assert len(set(killed)) >= 0.75 * len(set(boundaries)), (len(killed), len(boundaries))
    _assert_converged(runbook_world, reference, where=json.dumps(killed[-3:]))
