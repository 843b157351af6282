"""The runbook core with stand-in stages (pure Python, no API): order, deferred planning and
re-planning, stopping at the first failure, resuming, down's reverse order and flags, selection.

The registry is replaced for these tests only, to prove the contract stages 2-5 plug into.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from hpkv.config import Settings
from hpkv.context import RunContext
from hpkv.errors import ConfirmationRequired, UsageError, WaitTimeout
from hpkv.runbook import Runbook, StageEvent, StageFailed, select_stages, stage_findings
from hpkv.runbook.profile import load_profile
from hpkv.stages.base import Action, ApplyResult, Check, CheckState, Plan, PlanDeferred, Stage, Verb
from hpkv.stages.base import Detector as StageDetector

# What the stand-in stages "installed"; reset per test.
WORLD: dict[str, Any] = {}


class FakeStage(Stage):
    needs: ClassVar[str | None] = None

    def _installed(self) -> set[str]:
        return WORLD["installed"]

    def status(self) -> list[Check]:
        ok = self.name in self._installed()
        state = CheckState.OK if ok else CheckState.FAIL
        return [
            self.check("installed", state, f"{self.name} installed={ok}", "run it"),
            self.check("always-fine", CheckState.OK, "fine"),
        ]

    def plan(self, **_: Any) -> Plan:
        WORLD["log"].append(f"plan {self.name}")
        if self.needs and self.needs not in self._installed():
            raise PlanDeferred(self.needs, f"{self.name} reads what {self.needs} installs")
        plan = Plan(stage=self.name)
        target = f"thing/{self.name}"
        if self.name in self._installed():
            plan.add(Action(target, Verb.NONE, "present"))
        else:
            plan.add(Action(target, Verb.CREATE, "install", run=lambda: self._install()))
        return plan

    def _install(self) -> None:
        if self.name in WORLD["fail"]:
            raise WaitTimeout(f"{self.name} did not become ready", fix="look at its pods")
        self._installed().add(self.name)
        WORLD["log"].append(f"install {self.name}")

    def plan_remove(self, **options: Any) -> Plan:
        WORLD["remove_options"][self.name] = options
        plan = Plan(stage=self.name)
        target = f"thing/{self.name}"
        if self.name not in self._installed():
            plan.add(Action(target, Verb.NONE, "absent"))
            return plan
        plan.add(
            Action(
                target,
                Verb.DELETE,
                "uninstall",
                run=lambda: self._installed().discard(self.name),
                destructive=bool(options.get("delete_data")) and "data" in self.remove_flags_text,
            )
        )
        if not options.get("delete_data"):
            plan.kept.append("its data (pass --delete-data)")
        return plan

    remove_flags_text: ClassVar[str] = ""


class Alpha(FakeStage):
    name, title, number = "alpha", "Alpha", 1


class Beta(FakeStage):
    name, title, number = "beta", "Beta", 2
    remove_flags = frozenset({"delete_data"})
    remove_flags_text = "data"


class Gamma(FakeStage):
    name, title, number = "gamma", "Gamma", 3
    needs = "beta"


class Bench(FakeStage):
    name, title, number = "bench", "Bench", 5
    optional = True
    plan_remove = Stage.plan_remove  # nothing to remove: 'down' skips it


class Unverified(Alpha):
    """Applies, then its verification finds the stage broken."""

    def apply(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        result.checks.append(self.check("ready", CheckState.FAIL, "0/2 pods ready", "see pods"))
        return result


class Broken(Beta):
    """Cannot be planned: a configuration error."""

    def plan(self, **_: Any) -> Plan:
        raise UsageError("beta.size is invalid", fix="set beta.size")


class Sneaky(Gamma):
    """Once planned for real (after beta), also deletes data the combined plan did not show."""

    def plan(self, **options: Any) -> Plan:
        plan = super().plan(**options)
        plan.add(Action("pvc/data", Verb.DELETE, "recreate", run=lambda: None, destructive=True))
        return plan


REGISTRY = [
    ("alpha", __name__, "Alpha"),
    ("beta", __name__, "Beta"),
    ("gamma", __name__, "Gamma"),
    ("bench", __name__, "Bench"),
]


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    import hpkv.stages

    monkeypatch.setattr(hpkv.stages, "STAGES", REGISTRY)
    WORLD.clear()
    WORLD.update(installed=set(), fail=set(), log=[], remove_options={})


def _book(direction: str = "up", **kwargs: Any) -> tuple[Runbook, list[StageEvent]]:
    events: list[StageEvent] = []
    ctx = RunContext(Settings(data={"cluster": "demo"}))
    book = Runbook(ctx, direction, events=events.append, **kwargs)  # type: ignore[arg-type]
    return book, events


def test_combined_plan_defers_then_replans_right_before_applying() -> None:
    book, events = _book()
    runs = book.plan()
    assert [r.state for r in runs] == ["planned", "planned", "deferred"]
    assert runs[2].deferred is not None and runs[2].deferred.after == "beta"
    assert book.changes == 2
    assert "will be planned after stage beta runs" in [e.line() for e in events][-1]

    book.run()
    assert WORLD["installed"] == {"alpha", "beta", "gamma"}
    assert [r.state for r in runs] == ["applied", "applied", "applied"]
    # gamma was planned a second time, after beta's apply and before its own
    log = WORLD["log"]
    assert log.index("install beta") < log.index("plan gamma", log.index("install beta"))
    lines = [e.line() for e in events]
    assert "[3/3] gamma: planning again (an earlier stage ran)" in lines
    assert lines[-1] == "[3/3] gamma: done, 1 change(s) made"


def test_a_stage_deferred_to_a_stage_outside_the_range_fails_before_any_change() -> None:
    book, _ = _book(first="gamma")
    with pytest.raises(StageFailed) as info:
        book.plan()
    assert info.value.one_line() == (
        "planning stage gamma failed: it needs stage beta first, which this run does not "
        "include (gamma reads what beta installs). Fix: include stage beta (widen "
        "--from/--through); then rerun 'hpkv up'"
    )
    assert WORLD["installed"] == set()


def test_converged_run_plans_only_none_and_does_not_replan() -> None:
    WORLD["installed"].update({"alpha", "beta", "gamma"})
    book, events = _book()
    book.plan()
    book.run()
    assert book.changes == 0
    assert [r.state for r in book.runs] == ["converged"] * 3
    assert not any("planning again" in e.detail for e in events)


def test_stops_at_first_failure_with_findings_then_resumes() -> None:
    WORLD["fail"].add("beta")
    book, _ = _book()
    book.plan()
    with pytest.raises(StageFailed) as info:
        book.run()
    error = info.value
    assert error.stage == "beta" and error.exit_code == 1
    assert error.one_line() == (
        "stage beta failed: beta did not become ready. Fix: look at its pods; then rerun "
        "'hpkv up' (it continues where it stopped)"
    )
    assert [r.state for r in book.runs] == ["applied", "failed", "deferred"]
    findings = book.runs[1].findings
    assert [(c.name, c.state) for c in findings] == [("installed", CheckState.FAIL)]
    assert "gamma" not in WORLD["installed"]

    WORLD["fail"].clear()
    again, _ = _book()
    again.plan()
    assert [r.changes for r in again.runs] == [0, 1, 0]  # alpha converged; gamma deferred
    again.run()
    assert [r.state for r in again.runs] == ["converged", "applied", "applied"]


def _use(monkeypatch: pytest.MonkeyPatch, *entries: tuple[str, str, str]) -> None:
    import hpkv.stages

    monkeypatch.setattr(hpkv.stages, "STAGES", list(entries))


def test_failed_verification_check_fails_the_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, ("alpha", __name__, "Unverified"))
    book, _ = _book()
    book.plan()
    with pytest.raises(StageFailed, match="verification failed: ready: 0/2 pods ready"):
        book.run()


def test_planning_failure_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, REGISTRY[0], ("beta", __name__, "Broken"))
    book, _ = _book()
    with pytest.raises(StageFailed) as info:
        book.plan()
    assert info.value.exit_code == 2  # a usage error stays a usage error
    assert info.value.one_line().startswith("planning stage beta failed: beta.size is invalid")
    assert WORLD["installed"] == set()


def test_replanned_stage_that_now_deletes_data_asks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _use(monkeypatch, *REGISTRY[:2], ("gamma", __name__, "Sneaky"))
    book, _ = _book()
    book.plan()
    asked: list[str] = []

    def refuse(run: Any) -> None:
        asked.append(run.name)
        raise ConfirmationRequired("gamma now deletes data", fix="rerun with --yes")

    with pytest.raises(ConfirmationRequired):
        book.run(confirm_more=refuse)
    assert asked == ["gamma"]
    assert "gamma" not in WORLD["installed"]


def test_down_runs_in_reverse_and_passes_remove_flags() -> None:
    WORLD["installed"].update({"alpha", "beta", "gamma"})
    book, events = _book("down", remove_options={"delete_data": True, "delete_iam": True})
    assert [r.name for r in book.runs] == ["gamma", "beta", "alpha"]
    assert book.unused_remove_flags() == ["--delete-iam"]
    book.plan()
    assert WORLD["remove_options"]["beta"] == {
        "delete_data": True,
        "delete_volumes": False,
        "delete_iam": True,
    }
    assert [a.target for _, a in book.destructive] == ["thing/beta"]
    book.run()
    assert WORLD["installed"] == set()
    assert [e.line() for e in events if e.kind == "applying"] == [
        "[1/3] gamma: removing 1 change(s)",
        "[2/3] beta: removing 1 change(s)",
        "[3/3] alpha: removing 1 change(s)",
    ]


def test_down_keeps_data_unless_flagged() -> None:
    WORLD["installed"].update({"beta"})
    book, _ = _book("down", first="beta", last="beta")
    book.plan()
    assert book.runs[0].plan is not None
    assert book.runs[0].plan.kept == ["its data (pass --delete-data)"]
    assert book.destructive == []


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, ["alpha", "beta", "gamma"]),
        ({"bench": True}, ["alpha", "beta", "gamma", "bench"]),
        ({"first": "beta"}, ["beta", "gamma"]),
        ({"last": "beta"}, ["alpha", "beta"]),
        ({"first": "gamma", "last": "bench"}, ["gamma", "bench"]),
        ({"first": "beta", "last": "beta"}, ["beta"]),
    ],
)
def test_select_stages_up(kwargs: dict[str, Any], expected: list[str]) -> None:
    assert select_stages("up", **kwargs) == expected


def test_select_stages_down_is_reversed_and_skips_unremovable_optional() -> None:
    assert select_stages("down") == ["gamma", "beta", "alpha"]
    assert select_stages("down", first="beta") == ["gamma", "beta"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"first": "gamma", "last": "alpha"}, "--from gamma comes after --through alpha"),
        ({"first": "nope"}, "--from nope: no such stage"),
        ({"last": "beta", "bench": True}, "--bench is outside --from/--through"),
    ],
)
def test_select_stages_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        select_stages("up", **kwargs)


def test_offline_plans_call_nothing_and_cannot_run() -> None:
    book, _ = _book()
    book.plan_offline(load_profile())
    for run in book.runs:
        assert run.plan is not None
        assert run.plan.notes == [f"no offline plan for {run.stage.title} yet; run with a cluster"]
    assert WORLD["log"] == []


def test_findings_fall_back_to_stage_diagnose_then_status() -> None:
    """A stage unknown to `hpkv diagnose` falls back to its own diagnose(), else its status()."""
    stage = Alpha(RunContext(Settings(data={})))
    assert [c.name for c in stage_findings(stage)] == ["installed"]  # status() fallback

    class WithDiagnose(Alpha):
        def diagnose(self) -> list[Check]:
            return [self.check("from-stage", CheckState.WARN, "stage diagnose")]

    with_diagnose = WithDiagnose(RunContext(Settings(data={})))
    assert [c.name for c in stage_findings(with_diagnose)] == ["from-stage"]

    class Broken(Alpha):
        def diagnose(self) -> list[Check]:
            raise RuntimeError("bug in diagnose")

    (finding,) = stage_findings(Broken(RunContext(Settings(data={}))))
    assert (
        finding.state is CheckState.UNKNOWN and "RuntimeError: bug in diagnose" in finding.evidence
    )


def test_findings_include_hpkv_diagnose_detectors_when_present(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With issue 7's `hpkv.health.diagnose` (run_detectors/new_report), its findings for the
    failed stage come first, then the stage's non-OK status checks."""
    import sys
    import types
    from dataclasses import dataclass as data

    @data
    class Severity:
        state: CheckState

    @data
    class Finding:
        id: str
        severity: Severity
        title: str
        evidence: str
        remediation: str

    @data
    class Detector:
        id: str

    @data
    class DetectorRun:
        detector: Detector
        result: str
        error: str = ""

    @data
    class Report:
        findings: list[Finding]
        detectors: list[DetectorRun]

    calls: list[Any] = []

    def run_detectors(ctx: RunContext, report: Report, *, only: list[str]) -> Report:
        calls.append(only)
        report.findings.append(
            Finding(
                "ai-toolkit-oom",
                Severity(CheckState.FAIL),
                "ai-toolkit OOM",
                "2 restarts",
                "raise memory",
            )
        )
        report.detectors.append(DetectorRun(Detector("slow-one"), "failed", "timed out after 20s"))
        return report

    module = types.ModuleType("hpkv.health.diagnose")
    module.run_detectors = run_detectors  # type: ignore[attr-defined]
    module.new_report = lambda ctx: Report([], [])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hpkv.health.diagnose", module)

    class Detecting(Alpha):
        def detectors(self) -> list[StageDetector]:
            return [StageDetector("ai-toolkit-oom", "ai-toolkit OOM", "ai-toolkit", list)]

    assert stage_findings(Alpha(RunContext(Settings(data={})))) != []
    assert calls == []  # a stage without detectors is not handed to diagnose
    findings = stage_findings(Detecting(RunContext(Settings(data={}))))
    assert calls == [["alpha"]]
    assert [(c.name, c.state) for c in findings] == [
        ("ai-toolkit-oom", CheckState.FAIL),
        ("slow-one", CheckState.UNKNOWN),
        ("installed", CheckState.FAIL),
    ]
    assert findings[0].evidence == "ai-toolkit OOM: 2 restarts"
