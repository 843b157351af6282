"""State shared by all commands: global options, settings, the run context and output.

Command modules call :func:`state` to get a :class:`CliState`, build a core object from it, and
render what the core returns. Confirmation of mutations lives here so every command asks the same
way: a plan is shown; on a TTY the user is asked; without a TTY ``--yes`` is required.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import typer

from hpkv.errors import Aborted, ConfirmationRequired, ExitCode
from hpkv.output import Output, OutputFormat

if TYPE_CHECKING:
    from hpkv.config import Settings
    from hpkv.context import RunContext
    from hpkv.output.reporter import ConsoleReporter
    from hpkv.stages.base import ApplyResult, Plan


@dataclass
class GlobalOptions:
    config: str | None = None
    region: str | None = None
    profile: str | None = None
    cluster: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    output: OutputFormat | None = None
    dry_run: bool = False
    yes: bool = False
    wait: bool | None = None
    timeout: str | None = None
    verbose: int = 0
    debug: bool = False
    # Extra top-level config values set by a command's own flags.
    overrides: dict[str, Any] = field(default_factory=dict)
    # False: ignore config files (``hpkv init`` writes the file rather than reading it).
    read_config: bool = True


class CliState:
    def __init__(self, options: GlobalOptions) -> None:
        self.options = options

    @cached_property
    def settings(self) -> Settings:
        from hpkv.config import load_settings

        flags: dict[str, Any] = {
            "cluster": self.options.cluster,
            "region": self.options.region,
            "profile": self.options.profile,
            "kubeconfig": self.options.kubeconfig,
            "context": self.options.context,
            "output": self.options.output.value if self.options.output else None,
            "timeout": self.options.timeout,
        }
        flags.update(self.options.overrides)
        if not self.options.read_config:
            return load_settings(flags=flags, read_file=False)
        return load_settings(config_path=self.options.config, flags=flags)

    @cached_property
    def output(self) -> Output:
        fmt = self.options.output
        if fmt is None:
            fmt = OutputFormat(self.settings.get("output", "table"))
        return Output(fmt)

    @cached_property
    def reporter(self) -> ConsoleReporter:
        from hpkv.output.reporter import ConsoleReporter

        return ConsoleReporter(sys.stderr, verbosity=self.options.verbose)

    @cached_property
    def ctx(self) -> RunContext:
        from hpkv.context import RunContext, RunOptions, parse_duration

        options = RunOptions(
            dry_run=self.options.dry_run,
            yes=self.options.yes,
            wait=self.options.wait,
            timeout=parse_duration(self.settings.get("timeout"), default=1800.0),
            verbose=self.options.verbose,
            debug=self.options.debug,
        )
        return RunContext(self.settings, options, reporter=self.reporter)


def state(ctx: typer.Context) -> CliState:
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState(GlobalOptions())
    return root.obj


def is_interactive() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def confirm_changes(
    cli: CliState, plans: Sequence[Plan], *, verb: str = "apply", deferred: int = 0
) -> bool:
    """True when the plans' changes may be made now; False for a dry run or nothing to do.

    ``deferred`` counts stages that will be planned once earlier ones have run (``hpkv up``).
    """
    changes = [a for p in plans for a in p.changes]
    if not (changes or deferred) or cli.options.dry_run:
        return False
    if cli.options.yes:
        return True
    destructive = [a for p in plans for a in p.destructive]
    what = f"{len(changes)} change(s)"
    if deferred:
        what += f" and {deferred} stage(s) planned after earlier ones run"
    if not is_interactive():
        raise ConfirmationRequired(
            f"refusing to {verb} {what} without confirmation (not on a terminal)",
            fix="review the plan with --dry-run, then rerun with --yes",
        )
    if destructive:
        names = "; ".join(f"{a.target}: {a.summary}" for a in destructive)
        cli.output.note(f"[red]This deletes data:[/red] {names}")
    if not typer.confirm(f"{verb.capitalize()} {what}?", default=False, err=True):
        raise Aborted("cancelled; nothing was changed", fix="rerun and answer 'y' to proceed")
    return True


def emit_plan_and_apply(
    cli: CliState,
    plans: Sequence[Plan],
    run: Any,
    *,
    verb: str = "apply",
) -> list[ApplyResult]:
    """Show the plan(s), confirm, run ``run(plan)`` for each, and render the outcome."""
    out = cli.output
    if not out.structured:
        out.plan(plans)
    proceed = confirm_changes(cli, plans, verb=verb)
    results: list[ApplyResult] = []
    if proceed:
        for plan in plans:
            results.append(run(plan))
    elif not any(p.changes for p in plans) and not cli.options.dry_run:
        # Already converged: still run post-apply verification (no writes happen).
        for plan in plans:
            results.append(run(plan))
    payload = {
        "dryRun": cli.options.dry_run,
        "applied": proceed,
        "plans": [p.to_dict() for p in plans],
        "results": [r.to_dict() for r in results],
    }
    if out.structured:
        out.data(payload)
    else:
        _render_results(cli, plans, results, proceed)
    return results


def _render_results(
    cli: CliState, plans: Sequence[Plan], results: Sequence[ApplyResult], applied: bool
) -> None:
    out = cli.output
    if cli.options.dry_run:
        out.text("dry run: nothing was changed")
    for result in results:
        for note in result.notes:
            out.text(f"note: {note}")
        if result.checks:
            out.checks(result.checks, title=f"{result.stage}: verification")
    if applied:
        done = sum(len(r.performed) for r in results)
        out.text(f"applied {done} change(s)")


def exit_with(code: int) -> None:
    if code != ExitCode.OK:
        raise typer.Exit(code)
