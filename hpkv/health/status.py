"""``hpkv status``: every section's checks, run concurrently, in one table with one overall state.

Each check runs with a timeout (default 10 s) inside an overall deadline (default 30 s); a check
that errs or gets no answer reads UNKNOWN with the reason, so a slow or unreachable API never hangs
the command. A stage that is not installed reads "not installed". The JSON/YAML document follows
``schemas/status.schema.json`` (``SCHEMA_VERSION``); new fields may be added, existing ones keep
their meaning.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv.health.engine import (
    Item,
    Limits,
    SectionRun,
    describe_failure,
    document_header,
    run_sections,
)
from hpkv.health.sections import sections
from hpkv.output import STATE_LABEL
from hpkv.stages.base import Check, CheckState, worst_state

if TYPE_CHECKING:
    from hpkv.context import RunContext

KIND = "hpkv.status"


@dataclass
class TimedCheck:
    check: Check
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = self.check.to_dict()
        data["seconds"] = None if self.seconds is None else round(self.seconds, 3)
        return data


@dataclass
class SectionStatus:
    name: str
    number: int
    title: str
    installed: bool | None
    checks: list[TimedCheck] = field(default_factory=list)

    @property
    def state(self) -> CheckState:
        return worst_state(c.check.state for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "number": self.number,
            "title": self.title,
            "installed": self.installed,
            "state": STATE_LABEL[self.state.value],
        }


@dataclass
class StatusReport:
    cluster: str
    generated_at: datetime.datetime
    seconds: float
    sections: list[SectionStatus]

    @property
    def checks(self) -> list[Check]:
        return [c.check for s in self.sections for c in s.checks]

    @property
    def state(self) -> CheckState:
        return worst_state(c.state for c in self.checks)

    @property
    def exit_code(self) -> int:
        return self.state.exit_code

    def to_dict(self) -> dict[str, Any]:
        return {
            **document_header(KIND, self.cluster, self.generated_at, self.seconds, self.state),
            "stages": [s.to_dict() for s in self.sections],
            "checks": [c.to_dict() for s in self.sections for c in s.checks],
        }


def collect_status(
    ctx: RunContext, *, only: Sequence[str] | None = None, limits: Limits | None = None
) -> StatusReport:
    limits = limits or Limits()
    cluster = ctx.require_cluster()
    generated = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    runs, seconds = run_sections(ctx, sections(ctx, only), _items, limits)
    return StatusReport(cluster, generated, seconds, [_section(run, limits) for run in runs])


def _items(stage: Any) -> list[Item]:
    return [Item(s.name, s.run, s.requires_install) for s in stage.check_functions()]


def _section(run: SectionRun, limits: Limits) -> SectionStatus:
    stage = run.stage
    result = SectionStatus(stage.name, stage.number, stage.title, run.installed)
    skipped = False
    for item in run.items:
        if run.skipped(item):
            skipped = True
            continue
        outcome = run.outcomes.get(item.name)
        if outcome is None:
            reason = run.not_run_reason(item) or "not run"
            result.checks.append(TimedCheck(_unknown(stage, item.name, reason)))
        elif outcome.ok:
            result.checks.extend(_checks_from(stage, item.name, outcome.value, outcome.seconds))
        else:
            reason = describe_failure(outcome, limits)
            result.checks.append(TimedCheck(_unknown(stage, item.name, reason), outcome.seconds))
    if skipped:
        result.checks.append(TimedCheck(_stamped(stage, stage.not_installed_check())))
    return result


def _checks_from(stage: Any, name: str, value: Any, seconds: float) -> list[TimedCheck]:
    if not isinstance(value, list) or not all(isinstance(c, Check) for c in value):
        reason = f"internal error: check returned {type(value).__name__}, not a list of checks"
        return [TimedCheck(_unknown(stage, name, reason), seconds)]
    return [TimedCheck(_stamped(stage, c), seconds) for c in value]


def _stamped(stage: Any, check: Check) -> Check:
    return check if check.stage else dataclasses.replace(check, stage=stage.name)


def _unknown(stage: Any, name: str, reason: str) -> Check:
    return Check(
        name=name,
        state=CheckState.UNKNOWN,
        evidence=reason,
        remediation="check access to the AWS and Kubernetes APIs, then rerun",
        stage=stage.name,
    )
