"""Runs the checks or detectors of several sections concurrently, honouring installation probes.

Per section, ``installed()`` runs as a task of its own; items that need no installation start at
once beside it, and those marked ``requires_install`` are queued when the probe says the section is
installed (or cannot tell). Items of a section that is not installed are skipped; items whose
probe failed or timed out are reported as not run, with the reason. Shared reads are memoized for
the run (``ctx.shared_reads``); the boto3 clients the sections call are built ahead, in a background
thread, in the order the run needs them (``aws_services``); and the garbage collector leaves the
objects that existed before the run alone during it (``fewer_gc_pauses``).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv.concurrency import DEFAULT_WORKERS, Outcome, TaskRunner, fewer_gc_pauses
from hpkv.errors import HpkvError

if TYPE_CHECKING:
    from hpkv.context import RunContext
    from hpkv.stages.base import CheckState, Stage

INSTALLED = "installed()"


@dataclass(frozen=True)
class Item:
    name: str
    run: Callable[[], Any]
    requires_install: bool


@dataclass
class SectionRun:
    stage: Stage
    items: list[Item]
    installed: bool | None = None
    probe_error: str | None = None  # why the installation state is unknown
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def skipped(self, item: Item) -> bool:
        return item.requires_install and self.installed is False

    def not_run_reason(self, item: Item) -> str | None:
        if item.name in self.outcomes or self.skipped(item):
            return None
        if self.probe_error:
            return f"not run: could not tell whether {self.stage.name} is installed ({self.probe_error})"
        return "not run: the overall deadline passed first"


@dataclass
class Limits:
    item_timeout: float = 10.0
    deadline: float = 30.0
    workers: int = DEFAULT_WORKERS


def document_header(
    kind: str,
    cluster: str,
    generated_at: datetime.datetime,
    seconds: float,
    state: CheckState,
) -> dict[str, Any]:
    """The fields every health document starts with (see the JSON schemas)."""
    from hpkv.output import STATE_LABEL

    return {
        "kind": kind,
        "schemaVersion": 1,
        "cluster": cluster,
        "generatedAt": generated_at.isoformat().replace("+00:00", "Z"),
        "durationSeconds": round(seconds, 3),
        "state": STATE_LABEL[state.value],
        "exitCode": state.exit_code,
    }


def describe_failure(outcome: Outcome, limits: Limits) -> str:
    """One line for an item that raised or timed out."""
    if outcome.deadline_hit:
        return f"no answer before the overall deadline ({limits.deadline:g}s)"
    if outcome.timed_out:
        return f"no answer within {limits.item_timeout:g}s (the API is slow or unreachable)"
    error = outcome.error
    if isinstance(error, HpkvError):
        return error.one_line()
    detail = " ".join(str(error).split())[:300]
    return f"internal error: {type(error).__name__}: {detail} (rerun with --debug and report it)"


def run_sections(
    ctx: RunContext,
    sections: Sequence[Stage],
    items_of: Callable[[Stage], list[Item]],
    limits: Limits,
) -> tuple[list[SectionRun], float]:
    """Run every section's items; returns the section runs and the wall time in seconds."""
    started = time.monotonic()
    runner = TaskRunner(
        workers=limits.workers, task_timeout=limits.item_timeout, deadline=limits.deadline
    )
    runs = [SectionRun(stage, items_of(stage)) for stage in sections]
    ctx.aws.prepare(aws_services(ctx, sections))
    with ctx.shared_reads(), fewer_gc_pauses():
        for run in runs:
            for item in run.items:
                if not item.requires_install:
                    runner.submit(f"{run.stage.name}/{item.name}", item.run)
            runner.submit(f"{run.stage.name}/{INSTALLED}", _probe(runner, run))
        outcomes = runner.wait()
    for run in runs:
        prefix = f"{run.stage.name}/"
        for key, outcome in outcomes.items():
            if key.startswith(prefix):
                run.outcomes[key[len(prefix) :]] = outcome
        probe = run.outcomes.pop(INSTALLED, None)
        if probe is not None and probe.ok:
            run.installed = probe.value
        elif probe is not None:
            run.probe_error = describe_failure(probe, limits)
        if ctx.options.debug:
            _report_tracebacks(ctx, run)
    return runs, time.monotonic() - started


def aws_services(ctx: RunContext, sections: Sequence[Stage]) -> list[str]:
    """The AWS services a run over these sections calls, in the order it first needs them.

    Without ``--context`` Kubernetes access starts from SageMaker and EKS DescribeCluster (and STS
    signs the token when no kubeconfig context matches the EKS endpoint); the cluster section reads
    them too. A stage's are those its module's ``IAM_ACTIONS`` name (test-checked against the
    calls its code makes).
    """
    from hpkv.health.iam import stage_actions
    from hpkv.health.sections import CLUSTER_SECTION

    wanted: list[str] = []
    if not ctx.settings.context or any(s.name == CLUSTER_SECTION for s in sections):
        wanted += ["sagemaker", "eks", "sts"]
    needs = stage_actions()
    for stage in sections:
        wanted += [need.action.split(":", 1)[0] for need in needs.get(stage.name, [])]
    return list(dict.fromkeys(wanted))


def _probe(runner: TaskRunner, run: SectionRun) -> Callable[[], bool | None]:
    def probe() -> bool | None:
        installed = run.stage.installed()
        if installed is not False:
            for item in run.items:
                if item.requires_install:
                    runner.submit(f"{run.stage.name}/{item.name}", item.run)
        return installed

    return probe


def _report_tracebacks(ctx: RunContext, run: SectionRun) -> None:
    import traceback

    for name, outcome in run.outcomes.items():
        if outcome.error is not None and not isinstance(outcome.error, HpkvError):
            text = "".join(traceback.format_exception(outcome.error))
            ctx.reporter.warn(f"{run.stage.name}/{name} failed:\n{text}")
