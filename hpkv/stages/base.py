"""The stage contract every stage module implements.

A stage offers:

* ``status()`` -> a list of :class:`Check` (name, state, evidence, remediation);
* ``plan(options)`` -> a :class:`Plan`: ordered :class:`Action` objects, each with a target, a verb
  (create/update/delete/none) and the before/after state it changes;
* ``apply(plan)`` -> runs the plan's actions in order, then the stage's own wait/verify steps;
* ``plan_remove(options)`` / ``remove(plan)`` -> the same for teardown.

For ``hpkv status`` and ``hpkv diagnose`` a stage may also offer (all optional, with defaults):

* ``check_functions()`` -> :class:`CheckSpec` objects, each an independently runnable part of
  ``status()`` (the default wraps ``status()`` as one); ``hpkv status`` runs them concurrently;
* ``installed()`` -> whether the stage's component exists (``None``: cannot tell); checks and
  detectors marked ``requires_install`` are then skipped and the stage reads "not installed";
* ``detectors()`` -> :class:`Detector` objects for ``hpkv diagnose``, each yielding
  :class:`Finding` objects with a stable id;
* ``namespaces()`` -> the Kubernetes namespaces the stage owns (diagnose and the support bundle
  inspect them); ``iam_roles()`` -> the IAM roles it creates or uses (their trust policies go
  into the support bundle);
* a module-level ``IAM_ACTIONS`` list (``hpkv.health.iam.IamNeed``) for ``hpkv diagnose --iam``.

Reads several checks share go through ``ctx.memo`` (see ``hpkv.reads``), so one health run fetches
each of them once.
For ``hpkv up`` / ``hpkv down`` (``hpkv.runbook``) a stage may also:

* raise :class:`PlanDeferred` from ``plan``/``plan_remove`` when its plan needs an earlier stage's
  result (e.g. the L2 policy needs the operator's CRD): ``up`` shows "will be planned after stage
  X runs" in the combined plan and plans the stage again right before applying it;
* implement ``plan_offline(profile)``: the plan for a fresh example cluster described by a
  :class:`hpkv.runbook.profile.ClusterProfile`, with no API call (``hpkv up --offline --dry-run``);
* set ``optional = True`` (``up`` runs it only with ``--bench`` or when ``--from``/``--through``
  name it), ``remove_flags`` (the ``down`` flags it honours: ``delete_data``, ``delete_volumes``,
  ``delete_iam``; ``plan_remove`` receives them as keyword arguments) and list what ``down`` keeps
  in ``Plan.kept``;
* implement ``diagnose()`` -> list of :class:`Check` (findings printed when ``up`` stops at it,
  after ``hpkv diagnose``'s detector findings; the default is the non-OK checks of ``status()``).

Planning only reads. A stage already in its desired state yields a plan whose actions are all
``none``, and applying it performs zero mutating API calls. Every action re-reads what it needs, so
an interrupted apply converges when it is run again.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from hpkv.errors import PreconditionFailed

if TYPE_CHECKING:
    from hpkv.context import RunContext
    from hpkv.runbook.profile import ClusterProfile


class CheckState(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"

    @property
    def severity(self) -> int:
        """Order for "worst state" aggregation: ok < warn < unknown < fail."""
        return {"ok": 0, "warn": 1, "unknown": 2, "fail": 3}[self.value]

    @property
    def exit_code(self) -> int:
        """Nagios-style exit code: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
        return {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}[self.value]


def worst_state(states: Iterable[CheckState]) -> CheckState:
    worst = CheckState.OK
    for state in states:
        if state.severity > worst.severity:
            worst = state
    return worst


@dataclass(frozen=True)
class Check:
    """One status check: what was checked, what was found, and how to fix it."""

    name: str
    state: CheckState
    evidence: str
    remediation: str = ""
    stage: str = ""

    def to_dict(self) -> dict[str, str]:
        return {
            "stage": self.stage,
            "name": self.name,
            "state": self.state.value,
            "evidence": self.evidence,
            "remediation": self.remediation,
        }


CheckFunction = Callable[[], list[Check]]


@dataclass(frozen=True)
class CheckSpec:
    """One independently runnable part of a stage's status.

    ``run`` returns one or more checks (a check over many objects, such as every endpoint, may
    return one per object). With ``requires_install`` the check is skipped when the stage's
    ``installed()`` says False.
    """

    name: str
    run: CheckFunction = field(compare=False)
    requires_install: bool = True


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def state(self) -> CheckState:
        return {"critical": CheckState.FAIL, "warning": CheckState.WARN, "info": CheckState.OK}[
            self.value
        ]

    @property
    def rank(self) -> int:
        return {"critical": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True)
class Finding:
    """A known failure (or its risk) found by a detector: what, where, the evidence and the fix."""

    id: str
    severity: Severity
    component: str
    title: str
    evidence: str
    remediation: str
    stage: str = ""
    objects: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "component": self.component,
            "stage": self.stage,
            "title": self.title,
            "evidence": self.evidence,
            "remediation": self.remediation,
            "objects": list(self.objects),
        }


@dataclass(frozen=True)
class Detector:
    """Looks for one known failure; every finding it returns carries its ``id``.

    ``run`` reads (never writes) and returns the findings, an empty list when all is well.
    ``requires_install``: skipped when the owning stage's ``installed()`` says False.
    ``supersedes``: ids of generic detectors this one refines; a finding of theirs whose objects
    all appear in one of this detector's findings is not reported twice.
    """

    id: str
    title: str
    component: str
    run: Callable[[], list[Finding]] = field(compare=False)
    stage: str = ""
    requires_install: bool = True
    supersedes: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        detector_id: str,
        title: str,
        component: str,
        detect: Callable[[Detector], list[Finding]],
        **options: Any,
    ) -> Detector:
        """A detector whose ``detect`` function receives it (to build its findings)."""
        detector = cls(detector_id, title, component, lambda: detect(detector), **options)
        return detector

    def finding(
        self,
        severity: Severity,
        evidence: str,
        remediation: str,
        objects: Iterable[str] = (),
        *,
        title: str | None = None,
    ) -> Finding:
        return Finding(
            id=self.id,
            severity=severity,
            component=self.component,
            title=title or self.title,
            evidence=evidence,
            remediation=remediation,
            stage=self.stage,
            objects=tuple(objects),
        )

    def describe(self) -> dict[str, str]:
        return {
            "id": self.id,
            "stage": self.stage,
            "component": self.component,
            "title": self.title,
        }


@dataclass(frozen=True)
class IamNeed:
    """An IAM action hpkv calls, on which resource, and why (``hpkv diagnose --iam``).

    ``resource`` is an ARN template with ``{partition}``, ``{region}``, ``{account}``,
    ``{cluster_arn}``, ``{eks_cluster_arn}`` and ``{eks_cluster}``; ``action`` may end in a
    wildcard (``eks:Describe*``).
    """

    action: str
    resource: str = "*"
    why: str = ""


class PlanDeferred(PreconditionFailed):
    """A stage cannot be planned until an earlier stage has run (``after`` names that stage).

    ``hpkv up`` shows the stage as "will be planned after stage <after> runs" and plans it again
    right before applying it; a stage command run on its own shows it as one line with the fix.
    """

    def __init__(self, after: str, reason: str, *, fix: str | None = None) -> None:
        super().__init__(reason, fix=fix or f"run stage '{after}' first ('hpkv up' does it)")
        self.after = after
        self.reason = reason.rstrip(".")


class Verb(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    NONE = "none"


def _as_text(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.splitlines()
    import yaml

    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False).splitlines()


@dataclass
class Action:
    """One step of a plan.

    ``run`` performs the change; it is ``None`` for ``none`` actions. ``destructive`` marks actions
    that delete or reformat user data: the CLI names them in the confirmation.
    """

    target: str
    verb: Verb
    summary: str
    before: Any = None
    after: Any = None
    run: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    destructive: bool = False

    @property
    def changes(self) -> bool:
        return self.verb is not Verb.NONE

    def diff(self) -> str:
        lines = difflib.unified_diff(
            _as_text(self.before),
            _as_text(self.after),
            fromfile=f"{self.target} (live)",
            tofile=f"{self.target} (desired)",
            lineterm="",
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "verb": self.verb.value,
            "summary": self.summary,
            "destructive": self.destructive,
            "before": _jsonable(self.before),
            "after": _jsonable(self.after),
        }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@dataclass
class Plan:
    stage: str
    actions: list[Action] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What a removal leaves in place (data, volumes, IAM roles) and the flag that would delete it.
    kept: list[str] = field(default_factory=list)

    @property
    def changes(self) -> list[Action]:
        return [a for a in self.actions if a.changes]

    @property
    def is_noop(self) -> bool:
        return not self.changes

    @property
    def destructive(self) -> list[Action]:
        return [a for a in self.actions if a.destructive]

    def add(self, action: Action) -> Action:
        self.actions.append(action)
        return action

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "stage": self.stage,
            "changes": len(self.changes),
            "actions": [a.to_dict() for a in self.actions],
            "notes": list(self.notes),
        }
        if self.kept:
            data["kept"] = list(self.kept)
        return data


@dataclass
class ApplyResult:
    stage: str
    performed: list[Action] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "performed": [a.to_dict() for a in self.performed],
            "checks": [c.to_dict() for c in self.checks],
            "notes": list(self.notes),
        }


class Stage:
    """Base class of a stage. Subclasses set ``name``/``title`` and implement the four verbs."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    number: ClassVar[int] = 0
    # ``hpkv up`` runs an optional stage (the benchmark) only with --bench or when named.
    optional: ClassVar[bool] = False
    # The ``hpkv down`` flags plan_remove honours: "delete_data", "delete_volumes", "delete_iam".
    remove_flags: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    # --- reads -------------------------------------------------------------------------------
    def status(self) -> list[Check]:
        raise NotImplementedError

    def check_functions(self) -> list[CheckSpec]:
        """The stage's checks as independently runnable parts (default: ``status()`` as one)."""
        return [CheckSpec(self.name, self.status, requires_install=False)]

    def run_check_functions(self) -> list[Check]:
        """``status()`` for a stage that implements ``check_functions()``: all of them in turn,
        each shared read made once."""
        with self.ctx.shared_reads():
            return [check for spec in self.check_functions() for check in spec.run()]

    def installed(self) -> bool | None:
        """Whether the stage's component exists; None when the stage cannot tell."""
        return None

    def not_installed_check(self) -> Check:
        return self.check(
            "installed", CheckState.WARN, "not installed", f"run 'hpkv {self.name} apply'"
        )

    def detectors(self) -> list[Detector]:
        """Detectors for ``hpkv diagnose`` (none by default)."""
        return []

    def namespaces(self) -> list[str]:
        """Kubernetes namespaces the stage owns (diagnose and the support bundle read them)."""
        return []

    def iam_roles(self) -> list[str]:
        """IAM roles (names or ARNs) the stage creates or uses; the support bundle includes
        their trust policies."""
        return []

    def plan(self, **options: Any) -> Plan:
        raise NotImplementedError

    def plan_remove(self, **options: Any) -> Plan:
        raise NotImplementedError

    def plan_offline(self, profile: ClusterProfile) -> Plan:
        """The plan for the fresh cluster ``profile`` describes, computed without any API call.

        Stages without an offline model say so in a note. A good implementation feeds the
        profile's API-shaped answers (``profile.describe_hyperpod()`` ...) to the same code the
        live ``plan`` uses, and assumes the earlier stages have run.
        """
        return Plan(
            stage=self.name,
            notes=[f"no offline plan for {self.title or self.name} yet; run with a cluster"],
        )

    # --- writes ------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> ApplyResult:
        return self.run_plan(plan)

    def remove(self, plan: Plan) -> ApplyResult:
        return self.run_plan(plan)

    def run_plan(self, plan: Plan) -> ApplyResult:
        result = ApplyResult(stage=self.name)
        for action in plan.actions:
            if not action.changes or action.run is None:
                continue
            self.ctx.reporter.step(f"{action.verb.value} {action.target}: {action.summary}")
            action.run()
            result.performed.append(action)
        return result

    # --- helpers -----------------------------------------------------------------------------
    def check(self, name: str, state: CheckState, evidence: str, remediation: str = "") -> Check:
        return Check(
            name=name, state=state, evidence=evidence, remediation=remediation, stage=self.name
        )


def stage_states(checks: Sequence[Check]) -> CheckState:
    return worst_state(c.state for c in checks)
