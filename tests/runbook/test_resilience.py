"""Resilience of `hpkv up`: AWS throttling, 5xx and timeouts (botocore's retry modes), Kubernetes
409/429/500 responses, and a process killed with SIGKILL at every step boundary. After each, a
re-run converges to the same end state as an undisturbed run, with no duplicate resources and no
data lost, and with no manual cleanup. Parametrized over the stage registry: a stage's fault
targets and data-loss invariants live in its StageHarness (tests/harness/runbook.py).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpkv.stages import stage_names
from tests.harness.aws import Fault
from tests.harness.aws.server import READ_PREFIXES
from tests.harness.kube_proxy import KubeFault, KubeProxy
from tests.harness.runbook import (
    COUNTS,
    STAGE_HARNESSES,
    StageHarness,
    end_state,
    fresh_cluster,
    harness_for,
    reset,
    stage_of_lines,
)
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]

REPO = Path(__file__).resolve().parents[2]
AWS_KINDS = ("throttle", "server", "unavailable", "timeout", "persistent")
KUBE_STATUSES = (409, 429, 500)

# stage -> end state of an undisturbed 'up --from S --through S' (after the earlier stages)
_REFERENCE: dict[str, dict[str, Any]] = {}


def _cases(targets: Callable[[StageHarness], list[tuple[Any, str]]]) -> list[Any]:
    """(stage, target, kind) for every registered stage; one failing case for a stage without a
    StageHarness."""
    cases = []
    for stage in stage_names():
        harness = STAGE_HARNESSES.get(stage)
        if harness is None:
            cases.append(pytest.param(stage, None, None, id=f"{stage}-no-harness"))
            continue
        for target, kind in targets(harness):
            label = target if isinstance(target, str) else " ".join(target)
            cases.append(pytest.param(stage, target, kind, id=f"{stage}-{label}-{kind}"))
    return cases


def _aws_cases() -> list[Any]:
    return _cases(lambda h: [(a, k) for a in h.aws_actions for k in AWS_KINDS])


def _kube_cases() -> list[Any]:
    return _cases(lambda h: [(r, s) for r in h.kube_requests for s in KUBE_STATUSES])


# --- helpers -------------------------------------------------------------------------------------
def _converge_before(scenario: Scenario, stage: str) -> None:
    """The fresh cluster with every stage before ``stage`` applied."""
    fresh_cluster(scenario)
    names = stage_names()
    index = names.index(stage)
    if index:
        result = scenario.hpkv("up", "--cluster", "demo", "--through", names[index - 1], "--yes")
        assert result.exit_code == 0, result


def _up_stage(scenario: Scenario, stage: str, env: dict[str, str] | None = None) -> Any:
    return scenario.hpkv(
        "up", "--cluster", "demo", "--from", stage, "--through", stage, "--yes", env=env
    )


def _reference(scenario: Scenario, stage: str) -> dict[str, Any]:
    if stage not in _REFERENCE:
        _converge_before(scenario, stage)
        result = _up_stage(scenario, stage)
        assert result.exit_code == 0, result
        _REFERENCE[stage] = end_state(scenario)
        reset(scenario)
    return _REFERENCE[stage]


def _assert_one_line_failure(result: Any) -> str:
    assert result.exit_code == 1, result
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("hpkv: error: ")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert "Fix: " in errors[0]
    return errors[0]


def _rerun_converges(scenario: Scenario, stage: str, reference: dict[str, Any]) -> None:
    mark = scenario.mark()
    again = _up_stage(scenario, stage)
    COUNTS["resume.runs"] += 1
    COUNTS["resume.writes"] += len(scenario.writes_since(mark))
    assert again.exit_code == 0, again
    _assert_end_state(scenario, stage, reference)


def _assert_end_state(scenario: Scenario, stage: str, reference: dict[str, Any]) -> None:
    state = end_state(scenario)
    assert state == reference
    STAGE_HARNESSES[stage].invariants(scenario, reference[stage], state[stage])


# --- AWS faults ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("stage", "action", "kind"), _aws_cases())
def test_aws_fault(
    scenario: Scenario,
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    action: str | None,
    kind: str | None,
) -> None:
    harness_for(stage)
    assert action is not None and kind is not None
    reference = _reference(scenario, stage)
    _converge_before(scenario, stage)
    service, name = action.split(":")
    writes = not name.startswith(READ_PREFIXES)
    if kind == "timeout":
        # reads: the request is held before the API sees it; writes: the API applies it and the
        # answer comes late, so botocore's retry meets the change it already made
        monkeypatch.setenv("HPKV_AWS_READ_TIMEOUT", "0.5")
        fault = Fault(service, name, kind="late" if writes else "delay", times=1, seconds=1.5)
    elif kind == "persistent":
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
        fault = Fault(service, name, kind="server", times=-1)
    else:
        fault = Fault(service, name, kind=kind, times=2)
    scenario.aws.inject(fault)
    times = fault.times
    result = _up_stage(scenario, stage)
    calls = sum(1 for c in scenario.aws.calls if (c.service, c.action) == (service, name))
    COUNTS["faults.aws"] += calls if kind == "persistent" else times - fault.times
    if kind == "persistent":
        line = _assert_one_line_failure(result)
        assert calls >= 2  # botocore tried twice (AWS_MAX_ATTEMPTS=2), then hpkv stopped
        assert "InternalFailure" in line
        scenario.aws.faults.clear()
        monkeypatch.delenv("AWS_MAX_ATTEMPTS")
        _rerun_converges(scenario, stage, reference)
        return
    assert fault.times == 0, f"{action} was not called: the fault was never injected"
    assert result.exit_code == 0, result
    _assert_end_state(scenario, stage, reference)


# --- Kubernetes faults ---------------------------------------------------------------------------
@pytest.mark.parametrize(("stage", "request_", "status"), _kube_cases())
def test_kubernetes_fault(
    scenario: Scenario,
    kube_proxy: KubeProxy,
    stage: str,
    request_: tuple[str, str] | None,
    status: int | None,
) -> None:
    harness_for(stage)
    assert request_ is not None and status is not None
    reference = _reference(scenario, stage)
    _converge_before(scenario, stage)
    method, path = request_
    times = 1 if status == 409 else 2
    fault = kube_proxy.inject(
        KubeFault(status, method=method, path=path, times=times, retry_after=0)
    )
    result = _up_stage(scenario, stage)
    injected = times - fault.times
    COUNTS["faults.kube"] += injected
    assert injected == times, f"{method} {path} was not requested: the fault was never injected"
    if status == 409:
        # not retried: the stage stops with one line, and a re-run continues
        line = _assert_one_line_failure(result)
        assert "conflict" in line
        _rerun_converges(scenario, stage, reference)
        return
    assert result.exit_code == 0, result  # 429 and 5xx are retried
    _assert_end_state(scenario, stage, reference)


# --- SIGKILL at every step boundary --------------------------------------------------------------
def _run_up(
    env: dict[str, str], kill_after: int | None, timeout: float = 120
) -> tuple[list[str], int]:
    """Run `python -m hpkv up` and SIGKILL it (and its children) right after stderr line
    ``kill_after`` appears. Returns the stderr lines seen and the exit status."""
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
                if kill_after is not None and len(lines) - 1 == kill_after:
                    os.killpg(proc.pid, signal.SIGKILL)
                    return lines, proc.wait(timeout=30)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"hpkv up did not finish in {timeout}s: {lines}")
        return lines, proc.wait(timeout=30)
    finally:
        proc.stderr.close()


@pytest.mark.parametrize("stage", stage_names())
def test_killed_at_every_step_boundary_then_rerun_converges(scenario: Scenario, stage: str) -> None:
    harness = harness_for(stage)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fresh_cluster(scenario)
    lines, code = _run_up(env, kill_after=None)
    assert code == 0, lines
    reference = end_state(scenario)
    owners = stage_of_lines(lines, stage_names()[0])
    boundaries = [i for i, owner in enumerate(owners) if owner == stage]
    assert boundaries, f"no progress lines for stage {stage}: {lines}"

    for index in boundaries:
        reset(scenario)
        fresh_cluster(scenario)
        scenario.aws.latency = 0.05  # the kill lands while the next call is in flight
        seen, code = _run_up(env, kill_after=index)
        assert seen == lines[: index + 1], "the run took another path than the reference"
        assert code == -signal.SIGKILL or (code == 0 and index == len(lines) - 1), code
        COUNTS["faults.kill"] += code == -signal.SIGKILL
        scenario.aws.latency = 0.0
        mark = scenario.mark()
        again = scenario.hpkv("up", "--cluster", "demo", "--yes")
        COUNTS["resume.runs"] += 1
        COUNTS["resume.writes"] += len(scenario.writes_since(mark))
        where = f"killed after line {index} {lines[index]!r}"
        assert again.exit_code == 0, f"{where}\n{again}"
        state = end_state(scenario)
        assert state == reference, where
        harness.invariants(scenario, reference[stage], state[stage])
