"""``hpkv status``: one view of every stage's checks, one overall state, Nagios exit codes."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hpkv.cli._common import CliState, exit_with, state

if TYPE_CHECKING:
    from hpkv.health.status import StatusReport

DEFAULT_INTERVAL = "10s"

StageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--stage",
        metavar="NAME",
        help="Only this section (repeatable): cluster, tiered-storage, ... (default: all).",
        show_default=False,
    ),
]
CheckTimeoutOpt = Annotated[
    str,
    typer.Option(
        "--check-timeout",
        metavar="DURATION",
        help="Give up on a check after this long; it reads UNKNOWN.",
    ),
]
DeadlineOpt = Annotated[
    str,
    typer.Option(
        "--deadline",
        metavar="DURATION",
        help="Overall limit; checks still running then read UNKNOWN.",
    ),
]


def status(
    ctx: typer.Context,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Refresh until interrupted (Ctrl-C)."),
    ] = False,
    interval: Annotated[
        str,
        typer.Option("--interval", metavar="DURATION", help="Time between refreshes with --watch."),
    ] = DEFAULT_INTERVAL,
    iterations: Annotated[
        int | None,
        typer.Option(
            "--iterations",
            min=1,
            metavar="N",
            help="With --watch: stop after N refreshes (default: until interrupted).",
            show_default=False,
        ),
    ] = None,
    stage: StageOpt = None,
    check_timeout: CheckTimeoutOpt = "10s",
    deadline: DeadlineOpt = "30s",
) -> None:
    """Check every stage at once: one table, one overall state (exit 0 OK, 1 WARNING, 2 CRITICAL,
    3 UNKNOWN)."""
    from hpkv.context import parse_duration
    from hpkv.health.engine import Limits

    cli = state(ctx)
    limits = Limits(
        item_timeout=parse_duration(check_timeout, default=10.0),
        deadline=parse_duration(deadline, default=30.0),
    )
    every = max(1.0, parse_duration(interval, default=10.0))
    if not watch:
        report = _collect(cli, stage, limits)
        _render(cli, report)
        exit_with(report.exit_code)
        return
    exit_with(_watch(cli, stage, limits, every, iterations))


def _collect(cli: CliState, only: list[str] | None, limits: Any) -> StatusReport:
    from hpkv.health.status import collect_status

    return collect_status(cli.ctx, only=only, limits=limits)


def _render(cli: CliState, report: StatusReport) -> None:
    out = cli.output
    out.data(report.to_dict(), lambda: _renderable(report))


def _renderable(report: StatusReport, footer: str = "") -> Any:
    from rich.console import Group
    from rich.text import Text

    from hpkv.output import STATE_LABEL, STATE_STYLE, checks_table

    table = checks_table(report.checks, title=f"hpkv status: cluster {report.cluster}")
    label, style = STATE_LABEL[report.state.value], STATE_STYLE[report.state.value]
    summary = Text.assemble(
        "overall: ",
        (label, style),
        f" ({len(report.checks)} checks in {report.seconds:.1f}s)",
    )
    parts: list[Any] = [table, summary]
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def _watch(
    cli: CliState, only: list[str] | None, limits: Any, every: float, iterations: int | None
) -> int:
    """Refresh in place on a terminal (table output); otherwise print each refresh in turn."""
    out = cli.output
    live = not out.structured and out.console.is_terminal
    code: int | None = None
    count = 0
    try:
        if live:
            from rich.live import Live

            with Live(console=out.console, auto_refresh=False, transient=False) as screen:
                while True:
                    report = _collect(cli, only, limits)
                    code, count = report.exit_code, count + 1
                    footer = _footer(report, every, iterations, count)
                    screen.update(_renderable(report, footer), refresh=True)
                    if iterations is not None and count >= iterations:
                        break
                    time.sleep(every)
        else:
            while True:
                report = _collect(cli, only, limits)
                code, count = report.exit_code, count + 1
                _emit_plain(cli, report)
                if iterations is not None and count >= iterations:
                    break
                time.sleep(every)
    except KeyboardInterrupt:
        if code is None:
            raise
    return code or 0


def _footer(report: StatusReport, every: float, iterations: int | None, count: int) -> str:
    when = report.generated_at.strftime("%H:%M:%S UTC")
    limit = f", refresh {count} of {iterations}" if iterations else ""
    return f"updated {when}; every {every:g}s{limit}; Ctrl-C to stop"


def _emit_plain(cli: CliState, report: StatusReport) -> None:
    """One refresh without a terminal: a JSON line, a YAML document, or the table."""
    from hpkv.output import OutputFormat, to_yaml

    out = cli.output
    if out.fmt is OutputFormat.JSON:
        import json

        out.stdout.write(json.dumps(report.to_dict(), default=str) + "\n")
    elif out.fmt is OutputFormat.YAML:
        out.stdout.write("---\n" + to_yaml(report.to_dict()))
    else:
        out.console.print(_renderable(report))
        out.console.print()
    out.stdout.flush()
    sys.stdout.flush()
