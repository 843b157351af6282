"""The stage contract every stage module implements.

A stage offers:

* ``status()`` -> a list of :class:`Check` (name, state, evidence, remediation);
* ``plan(options)`` -> a :class:`Plan`: ordered :class:`Action` objects, each with a target, a verb
  (create/update/delete/none) and the before/after state it changes;
* ``apply(plan)`` -> runs the plan's actions in order, then the stage's own wait/verify steps;
* ``plan_remove(options)`` / ``remove(plan)`` -> the same for teardown.

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

if TYPE_CHECKING:
    from hpkv.context import RunContext


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
        return {
            "stage": self.stage,
            "changes": len(self.changes),
            "actions": [a.to_dict() for a in self.actions],
            "notes": list(self.notes),
        }


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

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    # --- reads -------------------------------------------------------------------------------
    def status(self) -> list[Check]:
        raise NotImplementedError

    def plan(self, **options: Any) -> Plan:
        raise NotImplementedError

    def plan_remove(self, **options: Any) -> Plan:
        raise NotImplementedError

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
