"""The status framework: concurrent checks, timeouts, the deadline, installation probes and the
report's schema (with a fake stage registered beside stage 1)."""

from __future__ import annotations

import time

import pytest

from hpkv import stages
from hpkv.config import Settings
from hpkv.context import RunContext
from hpkv.health.engine import Limits
from hpkv.health.status import collect_status
from tests.health.conftest import validate
from tests.health.fake_stage import FakeStage


@pytest.fixture
def ctx(monkeypatch: pytest.MonkeyPatch) -> RunContext:
    monkeypatch.setattr(
        stages, "STAGES", [*stages.STAGES, ("fake", "tests.health.fake_stage", "FakeStage")]
    )
    monkeypatch.setattr(FakeStage, "installed_state", True)
    monkeypatch.setattr(FakeStage, "slow_seconds", 3.0)
    return RunContext(Settings({"cluster": "demo"}))


def _checks(report) -> dict[str, tuple[str, str]]:
    return {c.name: (c.state.value, c.evidence) for c in report.checks}


def test_each_check_gets_its_own_timeout_and_errors_read_unknown(ctx: RunContext) -> None:
    started = time.monotonic()
    report = collect_status(ctx, only=["fake"], limits=Limits(item_timeout=0.5, deadline=10))
    assert time.monotonic() - started < 2.0
    checks = _checks(report)
    assert checks["fast"] == ("ok", "fine")
    assert checks["slow"] == ("unknown", "no answer within 0.5s (the API is slow or unreachable)")
    assert (
        checks["broken"][0] == "unknown"
        and "the fake API failed. Fix: retry" in checks["broken"][1]
    )
    assert checks["bug"][0] == "unknown"
    assert checks["bug"][1].startswith("internal error: ZeroDivisionError")
    assert checks["a"] == ("warn", "one") and checks["b"] == ("ok", "two")
    assert {c.stage for c in report.checks} == {"fake"}
    assert report.state.value == "unknown" and report.exit_code == 3
    document = report.to_dict()
    validate(document, "status")
    assert document["stages"] == [
        {
            "stage": "fake",
            "number": 9,
            "title": "A fake stage",
            "installed": True,
            "state": "UNKNOWN",
        }
    ]


def test_the_overall_deadline_ends_the_run(ctx: RunContext) -> None:
    started = time.monotonic()
    report = collect_status(ctx, only=["fake"], limits=Limits(item_timeout=10, deadline=0.5))
    assert time.monotonic() - started < 2.0
    assert _checks(report)["slow"][1] == "no answer before the overall deadline (0.5s)"


def test_a_stage_that_is_not_installed_reads_not_installed(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeStage, "installed_state", False)
    report = collect_status(ctx, only=["fake"])
    checks = _checks(report)
    assert checks == {
        "fast": ("ok", "fine"),
        "installed": ("warn", "not installed"),
    }
    assert report.to_dict()["stages"][0]["installed"] is False
    assert report.exit_code == 1


def test_a_failing_installation_probe_skips_what_needs_the_installation(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpkv.errors import ConnectionFailed

    monkeypatch.setattr(FakeStage, "installed_state", ConnectionFailed("cannot reach it", fix="x"))
    report = collect_status(ctx, only=["fake"], limits=Limits(item_timeout=0.5))
    checks = _checks(report)
    assert checks["fast"] == ("ok", "fine")
    state, evidence = checks["needs-install"]
    assert state == "unknown"
    assert evidence.startswith("not run: could not tell whether fake is installed (cannot reach it")
    assert report.to_dict()["stages"][0]["installed"] is None


def test_checks_run_concurrently_and_one_worker_runs_them_in_turn(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeStage, "slow_seconds", 0.3)

    def slow_only(self: FakeStage) -> list:
        from hpkv.stages.base import CheckSpec

        return [CheckSpec(f"slow{i}", self._slow, False) for i in range(4)]

    monkeypatch.setattr(FakeStage, "check_functions", slow_only)
    started = time.monotonic()
    collect_status(ctx, only=["fake"], limits=Limits(workers=16))
    concurrent = time.monotonic() - started
    started = time.monotonic()
    report = collect_status(ctx, only=["fake"], limits=Limits(workers=1))
    sequential = time.monotonic() - started
    assert concurrent < 0.9 <= sequential
    assert [c.state.value for c in report.checks] == ["ok"] * 4


def test_unknown_stage_name_is_a_usage_error(ctx: RunContext) -> None:
    from hpkv.errors import UsageError

    with pytest.raises(UsageError, match="unknown stage 'nope'"):
        collect_status(ctx, only=["nope"])
