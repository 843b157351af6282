"""``hpkv diagnose``: every section's detectors, run concurrently, into findings with stable ids.

A detector that errs or gets no answer in time is reported (``detectors[].result: failed``) and
makes the overall state UNKNOWN unless a finding is CRITICAL. Detectors of a stage that is not
installed are skipped when they need the installation. The JSON/YAML document follows
``schemas/diagnose.schema.json``.
"""

from __future__ import annotations

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
from hpkv.stages.base import CheckState, Detector, Finding, Severity, worst_state

if TYPE_CHECKING:
    from hpkv.context import RunContext
    from hpkv.health.bundle import BundleResult
    from hpkv.health.iam import IamReport
    from hpkv.stages.base import Stage

KIND = "hpkv.diagnose"


@dataclass
class DetectorRun:
    detector: Detector
    result: str  # ran | skipped | failed
    error: str = ""
    findings: int = 0
    seconds: float | None = None
    superseded: int = 0  # findings left out: a more specific detector reported the same objects

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.detector.describe(),
            "result": self.result,
            "error": self.error,
            "findings": self.findings,
            "superseded": self.superseded,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
        }


@dataclass
class DiagnoseReport:
    cluster: str
    generated_at: datetime.datetime
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    detectors: list[DetectorRun] = field(default_factory=list)
    iam: IamReport | None = None
    bundle: BundleResult | None = None
    ran_detectors: bool = False

    @property
    def state(self) -> CheckState:
        states = [f.severity.state for f in self.findings]
        states += [CheckState.UNKNOWN for d in self.detectors if d.result == "failed"]
        if self.iam is not None:
            states.append(self.iam.state)
        return worst_state(states)

    @property
    def exit_code(self) -> int:
        return self.state.exit_code

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **document_header(KIND, self.cluster, self.generated_at, self.seconds, self.state),
            "findings": [f.to_dict() for f in self.findings],
            "detectors": [d.to_dict() for d in self.detectors],
        }
        if self.iam is not None:
            data["iam"] = self.iam.to_dict()
        if self.bundle is not None:
            data["bundle"] = self.bundle.to_dict()
        return data


def new_report(ctx: RunContext) -> DiagnoseReport:
    return DiagnoseReport(
        ctx.require_cluster(), datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    )


def catalog(ctx: RunContext, only: Sequence[str] | None = None) -> list[Detector]:
    """Every registered detector (reads nothing)."""
    return [d for stage in sections(ctx, only) for d in stage.detectors()]


def run_detectors(
    ctx: RunContext,
    report: DiagnoseReport,
    *,
    only: Sequence[str] | None = None,
    limits: Limits | None = None,
) -> DiagnoseReport:
    limits = limits or Limits()
    chosen = sections(ctx, only)
    by_name: dict[tuple[str, str], Detector] = {}

    def items(stage: Stage) -> list[Item]:
        found = []
        for detector in stage.detectors():
            by_name[(stage.name, detector.id)] = detector
            found.append(Item(detector.id, detector.run, detector.requires_install))
        return found

    runs, seconds = run_sections(ctx, chosen, items, limits)
    report.seconds += seconds
    report.ran_detectors = True
    found: list[Finding] = []
    for run in runs:
        for item in run.items:
            detector_run = _detector_run(run, item, by_name[(run.stage.name, item.name)], limits)
            report.detectors.append(detector_run)
            outcome = run.outcomes.get(item.name)
            if detector_run.result == "ran" and outcome is not None:
                found.extend(outcome.value)
    report.findings.extend(_without_superseded(found, report.detectors))
    report.findings.sort(key=lambda f: (f.severity.rank, f.id, f.evidence))
    return report


def _without_superseded(findings: list[Finding], runs: list[DetectorRun]) -> list[Finding]:
    """Drop a generic finding whose objects a refining detector's finding covers entirely."""
    supersedes = {r.detector.id: r.detector.supersedes for r in runs if r.detector.supersedes}
    covers: dict[str, list[set[str]]] = {}
    for finding in findings:
        for generic in supersedes.get(finding.id, ()):
            covers.setdefault(generic, []).append(set(finding.objects))
    by_id = {r.detector.id: r for r in runs}
    kept = []
    for finding in findings:
        objects = set(finding.objects)
        if objects and any(objects <= cover for cover in covers.get(finding.id, [])):
            run = by_id[finding.id]
            run.findings -= 1
            run.superseded += 1
            continue
        kept.append(finding)
    return kept


def _detector_run(run: SectionRun, item: Item, detector: Detector, limits: Limits) -> DetectorRun:
    if run.skipped(item):
        return DetectorRun(detector, "skipped", f"{run.stage.name} is not installed")
    outcome = run.outcomes.get(item.name)
    if outcome is None:
        return DetectorRun(detector, "failed", run.not_run_reason(item) or "not run")
    if not outcome.ok:
        return DetectorRun(
            detector, "failed", describe_failure(outcome, limits), 0, outcome.seconds
        )
    value = outcome.value
    if not isinstance(value, list) or not all(
        isinstance(f, Finding) and f.id == detector.id for f in value
    ):
        return DetectorRun(
            detector, "failed", "internal error: detector returned something else than its findings"
        )
    return DetectorRun(detector, "ran", "", len(value), outcome.seconds)


def severity_counts(findings: Sequence[Finding]) -> dict[str, int]:
    return {s.value: sum(1 for f in findings if f.severity is s) for s in Severity}
