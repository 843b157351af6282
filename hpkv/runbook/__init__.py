"""``hpkv up`` and ``hpkv down``: the registered stages, planned together, run one by one.

``up`` plans every selected stage first (a stage whose plan needs an earlier stage's result raises
:class:`~hpkv.stages.base.PlanDeferred` and is shown as "planned after stage X runs"), the CLI asks
once, then each stage is planned again right before it is applied when an earlier stage changed
something. It stops at the first failed stage and collects that stage's diagnose findings. Every
stage is idempotent, so running ``up`` again after any interruption continues where it stopped: a
converged stage plans only ``none`` actions and its apply makes no write.

``down`` does the same with ``plan_remove``/``remove`` in reverse order, passing the
``delete_data``/``delete_volumes``/``delete_iam`` flags to the stages that honour them.

Progress goes through ``events`` (one :class:`StageEvent` per step); the CLI renders them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from hpkv.errors import HpkvError, UsageError
from hpkv.stages import stage_class, stage_names
from hpkv.stages.base import CheckState, PlanDeferred

if TYPE_CHECKING:
    from hpkv.context import RunContext
    from hpkv.runbook.profile import ClusterProfile
    from hpkv.stages.base import ApplyResult, Check, Plan, Stage

Direction = Literal["up", "down"]
REMOVE_FLAGS = ("delete_data", "delete_volumes", "delete_iam")


class StageFailed(HpkvError):
    """A stage failed during ``up``/``down``; keeps the cause's message, fix and exit code."""

    def __init__(self, stage: str, cause: HpkvError, *, message: str, fix: str) -> None:
        super().__init__(message, fix=fix)
        self.stage = stage
        self.cause = cause
        self.exit_code = cause.exit_code


@dataclass
class StageEvent:
    """One progress step of one stage (``kind``: planning, planned, deferred, applying, done,
    failed), rendered by the CLI as ``[index/total] stage: detail``."""

    kind: str
    index: int
    total: int
    stage: str
    detail: str

    def line(self) -> str:
        return f"[{self.index}/{self.total}] {self.stage}: {self.detail}"


@dataclass
class StageRun:
    """One stage's part of a run: its plan (or deferral), result, state and findings."""

    stage: Stage
    index: int
    plan: Plan | None = None
    deferred: PlanDeferred | None = None
    result: ApplyResult | None = None
    # pending -> planned | deferred -> converged | applied | failed
    state: str = "pending"
    error: HpkvError | None = None
    findings: list[Check] = field(default_factory=list)
    confirmed_destructive: set[tuple[str, str]] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.stage.name

    @property
    def changes(self) -> int:
        return len(self.plan.changes) if self.plan is not None else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "index": self.index,
            "title": self.stage.title,
            "state": self.state,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "deferred": (
                {"after": self.deferred.after, "reason": self.deferred.reason}
                if self.deferred is not None
                else None
            ),
            "result": self.result.to_dict() if self.result is not None else None,
            "error": self.error.one_line() if self.error is not None else None,
            "findings": [c.to_dict() for c in self.findings],
        }


def select_stages(
    direction: Direction,
    *,
    first: str | None = None,
    last: str | None = None,
    bench: bool = False,
) -> list[str]:
    """The stages a run covers, in the order it runs them (``down``: reversed).

    ``first``/``last`` bound the range in run order for both directions (``down --from curvine``
    removes curvine and every stage after it). Optional stages (the benchmark) are in ``up`` only
    with ``bench`` or when ``first``/``last`` names them, and in ``down`` only if they can be removed.
    """
    names = stage_names()
    for flag, value in (("--from", first), ("--through", last)):
        if value is not None and value not in names:
            raise UsageError(
                f"{flag} {value}: no such stage", fix=f"use one of: {', '.join(names)}"
            )
    start = names.index(first) if first else 0
    end = names.index(last) if last else len(names) - 1
    if start > end:
        raise UsageError(
            f"--from {first} comes after --through {last}",
            fix=f"stages run in this order: {', '.join(names)}",
        )
    optional = [n for n in names if stage_class(n).optional]
    if bench and not optional:
        raise UsageError(
            "--bench: this hpkv has no benchmark stage",
            fix="drop --bench (registered stages: " + ", ".join(names) + ")",
        )
    if bench and not any(start <= names.index(n) <= end for n in optional):
        raise UsageError(
            f"--bench is outside --from/--through ({names[start]} .. {names[end]})",
            fix="drop --bench or widen the range",
        )
    chosen = []
    for name in names[start : end + 1]:
        cls = stage_class(name)
        if direction == "down" and not _removable(cls):
            continue  # nothing to remove (the benchmark leaves nothing behind)
        if cls.optional and direction == "up" and not (bench or name in (first, last)):
            continue
        chosen.append(name)
    if not chosen:
        raise UsageError(
            f"stage {names[start]} has nothing to remove",
            fix="pick a range with stages that install something: "
            + ", ".join(n for n in names if _removable(stage_class(n))),
        )
    return list(reversed(chosen)) if direction == "down" else chosen


def _removable(cls: type[Stage]) -> bool:
    from hpkv.stages.base import Stage

    return cls.plan_remove is not Stage.plan_remove


def stage_findings(stage: Stage) -> list[Check]:
    """What is wrong with ``stage`` now: its diagnose findings, as non-OK checks.

    The findings are those of ``hpkv diagnose``'s detectors for the stage
    (``hpkv.health.diagnose.run_detectors``) followed by the stage's own
    ``diagnose()`` or, without one, its non-OK ``status()`` checks. Never raises: a diagnose that
    cannot run is reported as an UNKNOWN finding, so the failure being reported stays the one shown.
    """
    try:
        checks = _diagnose(stage)
    except HpkvError as exc:
        return [stage.check("diagnose", CheckState.UNKNOWN, f"could not run: {exc.one_line()}")]
    except Exception as exc:  # a bug in diagnose must not hide the failure being reported
        return [
            stage.check(
                "diagnose",
                CheckState.UNKNOWN,
                f"could not run: {type(exc).__name__}: {exc}",
                "rerun with --debug and report it",
            )
        ]
    return [c for c in checks if c.state is not CheckState.OK]


def _diagnose(stage: Stage) -> list[Check]:
    checks = _detector_findings(stage)
    diagnose = getattr(stage, "diagnose", None)
    if callable(diagnose):
        return checks + list(diagnose())
    try:
        return checks + list(stage.status())
    except NotImplementedError:
        return checks


def _detector_findings(stage: Stage) -> list[Check]:
    """``hpkv diagnose``'s findings for this stage, as checks (none for a stage without
    detectors: nothing is read then)."""
    from hpkv.health.diagnose import new_report, run_detectors

    if not stage.detectors():
        return []
    report = run_detectors(stage.ctx, new_report(stage.ctx), only=[stage.name])
    checks = [
        stage.check(
            finding.id,
            finding.severity.state,
            f"{finding.title}: {finding.evidence}",
            finding.remediation,
        )
        for finding in report.findings
    ]
    checks += [
        stage.check(run.detector.id, CheckState.UNKNOWN, f"detector failed: {run.error}")
        for run in report.detectors
        if run.result == "failed"
    ]
    return checks


class Runbook:
    """The stages of one ``up`` or ``down``, with their plans and results."""

    def __init__(
        self,
        ctx: RunContext,
        direction: Direction,
        *,
        first: str | None = None,
        last: str | None = None,
        bench: bool = False,
        remove_options: Mapping[str, bool] | None = None,
        events: Callable[[StageEvent], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.direction = direction
        self.remove_options = {k: bool((remove_options or {}).get(k)) for k in REMOVE_FLAGS}
        self._events = events
        names = select_stages(direction, first=first, last=last, bench=bench)
        self.runs = [StageRun(stage_class(n)(ctx), i) for i, n in enumerate(names, 1)]

    # --- reporting ------------------------------------------------------------------------------
    def _event(self, run: StageRun, kind: str, detail: str) -> None:
        event = StageEvent(kind, run.index, len(self.runs), run.name, detail)
        if self._events is not None:
            self._events(event)
        else:
            self.ctx.reporter.info(event.line())

    @property
    def verb(self) -> str:
        return "hpkv up" if self.direction == "up" else "hpkv down"

    def unused_remove_flags(self) -> list[str]:
        """``down`` flags given that no selected stage honours (nothing extra gets deleted)."""
        honoured = set().union(*(type(r.stage).remove_flags for r in self.runs))
        return [
            "--" + k.replace("_", "-")
            for k, v in self.remove_options.items()
            if v and k not in honoured
        ]

    # --- planning -------------------------------------------------------------------------------
    def preflight(self) -> None:
        """Fail before planning on what every stage needs: the cluster, AWS and Kubernetes access."""
        from hpkv.aws import sagemaker
        from hpkv.kube import kube_errors

        name = self.ctx.require_cluster()
        sagemaker.describe_cluster(self.ctx.aws, name)
        # an authenticated read: anonymous callers may read /version but not the API list
        with kube_errors("list the API resources"):
            self.ctx.kube.core.get_api_resources()

    def _plan_one(self, run: StageRun) -> Plan:
        if self.direction == "up":
            return run.stage.plan()
        return run.stage.plan_remove(**self.remove_options)

    def plan(self) -> list[StageRun]:
        """Plan every stage (reads only). Raises StageFailed when a stage cannot be planned."""
        for run in self.runs:
            self._event(run, "planning", "planning")
            try:
                run.plan = self._plan_one(run)
            except PlanDeferred as deferred:
                if deferred.after not in [r.name for r in self.runs[: run.index - 1]]:
                    self._fail(
                        run,
                        HpkvError(
                            f"it needs stage {deferred.after} first, which this run does not "
                            f"include ({deferred.reason})",
                            fix=f"include stage {deferred.after} (widen --from/--through)",
                        ),
                        planning=True,
                    )
                run.deferred, run.state = deferred, "deferred"
                self._event(run, "deferred", f"will be planned after stage {deferred.after} runs")
                continue
            except HpkvError as exc:
                self._fail(run, exc, planning=True)
            run.state = "planned"
            run.confirmed_destructive = _destructive_keys(run.plan)
            self._event(run, "planned", _planned_text(run.plan))
        return self.runs

    def plan_offline(self, profile: ClusterProfile) -> list[StageRun]:
        """Plan every stage for ``profile`` with no API call; the plans cannot be applied."""
        for run in self.runs:
            plan = run.stage.plan_offline(profile)
            for action in plan.actions:
                action.run = None
            run.plan, run.state = plan, "planned"
        return self.runs

    # --- running --------------------------------------------------------------------------------
    @property
    def changes(self) -> int:
        return sum(r.changes for r in self.runs)

    @property
    def deferred(self) -> list[StageRun]:
        return [r for r in self.runs if r.deferred is not None]

    @property
    def destructive(self) -> list[tuple[str, Any]]:
        return [(r.name, a) for r in self.runs if r.plan for a in r.plan.destructive]

    def run(self, *, confirm_more: Callable[[StageRun], None] | None = None) -> list[StageRun]:
        """Apply (or remove) each planned stage in order; stop at the first failure.

        A stage is planned again right before it runs when it was deferred or an earlier stage
        changed something. ``confirm_more(run)`` is called when that new plan deletes data the
        confirmed plan did not; it raises to refuse.
        """
        changed = False
        for run in self.runs:
            if run.deferred is not None or changed:
                self._replan(run, confirm_more)
            assert run.plan is not None
            count = len(run.plan.changes)
            verb = "applying" if self.direction == "up" else "removing"
            self._event(
                run, "applying", f"{verb} {count} change(s)" if count else "verifying (no changes)"
            )
            try:
                result = (
                    run.stage.apply(run.plan)
                    if self.direction == "up"
                    else run.stage.remove(run.plan)
                )
            except HpkvError as exc:
                self._fail(run, exc, planning=False)
            run.result = result
            failed = [c for c in result.checks if c.state is CheckState.FAIL]
            if failed:
                check = failed[0]
                self._fail(
                    run,
                    HpkvError(
                        f"verification failed: {check.name}: {check.evidence}",
                        fix=check.remediation or "see the findings above",
                    ),
                    planning=False,
                )
            run.state = "applied" if result.performed else "converged"
            changed = changed or bool(result.performed)
            self._event(run, "done", _done_text(result))
        return self.runs

    def _replan(self, run: StageRun, confirm_more: Callable[[StageRun], None] | None) -> None:
        self._event(run, "planning", "planning again (an earlier stage ran)")
        try:
            run.plan = self._plan_one(run)
        except PlanDeferred as deferred:
            self._fail(
                run,
                HpkvError(
                    f"still cannot be planned after stage {deferred.after}: {deferred.reason}",
                    fix=deferred.fix or f"check stage {deferred.after}",
                ),
                planning=True,
            )
        except HpkvError as exc:
            self._fail(run, exc, planning=True)
        run.deferred = None
        run.state = "planned"
        self._event(run, "planned", _planned_text(run.plan))
        new = _destructive_keys(run.plan) - run.confirmed_destructive
        if new and confirm_more is not None:
            confirm_more(run)
        run.confirmed_destructive |= new

    def _fail(self, run: StageRun, exc: HpkvError, *, planning: bool) -> NoReturn:
        run.state, run.error = "failed", exc
        self._event(run, "failed", f"failed: {exc.message}")
        run.findings = stage_findings(run.stage)
        if planning:
            message = f"planning stage {run.name} failed: {exc.message}"
            fix = f"{exc.fix or 'see the findings'}; then rerun '{self.verb}'"
        else:
            message = f"stage {run.name} failed: {exc.message}"
            fix = (
                f"{exc.fix or 'see the findings'}; then rerun '{self.verb}' "
                "(it continues where it stopped)"
            )
        raise StageFailed(run.name, exc, message=message, fix=fix) from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "stages": [r.to_dict() for r in self.runs],
            "changes": self.changes,
        }


def _destructive_keys(plan: Plan | None) -> set[tuple[str, str]]:
    return {(a.target, a.summary) for a in plan.destructive} if plan is not None else set()


def _planned_text(plan: Plan | None) -> str:
    count = len(plan.changes) if plan is not None else 0
    return f"{count} change(s) planned" if count else "converged (nothing to do)"


def _done_text(result: ApplyResult) -> str:
    performed = len(result.performed)
    text = f"done, {performed} change(s) made" if performed else "done, no change needed"
    if result.checks:
        text += f", verification {_worst(result.checks)}"
    return text


def _worst(checks: list[Check]) -> str:
    from hpkv.stages.base import worst_state

    return worst_state(c.state for c in checks).value
