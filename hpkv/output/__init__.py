"""Rendering: data to stdout as a rich table, JSON or YAML; progress and logs to stderr.

Core code reports progress through the :class:`Reporter` protocol (``hpkv.output.reporter``) and
returns data; the CLI renders that data with :class:`Output`. Colour and spinners appear only on a
terminal, and ``NO_COLOR`` turns colour off.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from hpkv.stages.base import Check, Plan


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


STATE_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "magenta"}
STATE_LABEL = {"ok": "OK", "warn": "WARNING", "fail": "CRITICAL", "unknown": "UNKNOWN"}
VERB_STYLE = {"create": "green", "update": "yellow", "delete": "red", "none": "dim"}


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)


def to_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False)


def make_console(file: IO[str], *, force_plain: bool = False) -> Console:
    from rich.console import Console

    # rich reads NO_COLOR itself; on a non-terminal it emits no colour codes.
    return Console(file=file, soft_wrap=False, no_color=force_plain or None, highlight=False)


class Output:
    """Renders command results in the selected format."""

    def __init__(
        self,
        fmt: OutputFormat = OutputFormat.TABLE,
        *,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        self.fmt = fmt
        self._stdout = stdout
        self._stderr = stderr
        self._out_console: Console | None = None
        self._err_console: Console | None = None

    @property
    def stdout(self) -> IO[str]:
        return self._stdout or sys.stdout

    @property
    def stderr(self) -> IO[str]:
        return self._stderr or sys.stderr

    @property
    def console(self) -> Console:
        if self._out_console is None:
            self._out_console = make_console(self.stdout)
        return self._out_console

    @property
    def err_console(self) -> Console:
        if self._err_console is None:
            self._err_console = make_console(self.stderr)
        return self._err_console

    @property
    def structured(self) -> bool:
        return self.fmt is not OutputFormat.TABLE

    # --- generic ------------------------------------------------------------------------------
    def data(self, data: Any, table: Callable[[], Any] | None = None) -> None:
        """Print ``data`` as JSON/YAML, or call ``table`` to build a rich renderable."""
        if self.fmt is OutputFormat.JSON:
            self.stdout.write(to_json(data) + "\n")
        elif self.fmt is OutputFormat.YAML:
            self.stdout.write(to_yaml(data))
        elif table is not None:
            self.console.print(table())
        else:
            self.stdout.write(to_yaml(data))
        self.stdout.flush()

    def text(self, message: str) -> None:
        """A human message for stdout in table mode (suppressed in JSON/YAML modes)."""
        if not self.structured:
            self.console.print(message)

    def note(self, message: str) -> None:
        """A message for stderr, in every mode."""
        self.err_console.print(message)

    # --- stage contract -----------------------------------------------------------------------
    def checks(self, checks: Sequence[Check], *, title: str | None = None) -> None:
        from hpkv.stages.base import worst_state

        overall = worst_state(c.state for c in checks)
        payload = {
            "state": STATE_LABEL[overall.value],
            "checks": [c.to_dict() for c in checks],
        }
        self.data(payload, lambda: checks_table(checks, title=title))
        if not self.structured:
            style = STATE_STYLE[overall.value]
            self.console.print(f"overall: [{style}]{STATE_LABEL[overall.value]}[/{style}]")

    def plan(self, plans: Iterable[Plan], *, show_diff: bool = True) -> None:
        plans = list(plans)
        payload = {"plans": [p.to_dict() for p in plans]}
        self.data(payload, lambda: plan_renderable(plans, show_diff=show_diff))


def checks_table(checks: Sequence[Check], *, title: str | None = None) -> Table:
    from rich.table import Table

    show_stage = len({c.stage for c in checks}) > 1
    table = Table(title=title, show_lines=False, expand=False)
    if show_stage:
        table.add_column("STAGE", no_wrap=True)
    table.add_column("CHECK", overflow="fold", ratio=1)
    table.add_column("STATE", no_wrap=True)
    table.add_column("EVIDENCE", overflow="fold", ratio=3)
    table.add_column("REMEDIATION", overflow="fold", ratio=2)
    for check in checks:
        style = STATE_STYLE[check.state.value]
        row = [
            check.name,
            f"[{style}]{STATE_LABEL[check.state.value]}[/{style}]",
            _escape(check.evidence),
            _escape(check.remediation),
        ]
        table.add_row(*([check.stage, *row] if show_stage else row))
    return table


def plan_renderable(plans: Sequence[Plan], *, show_diff: bool = True) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for plan in plans:
        table = Table(title=f"plan: {plan.stage}", expand=False)
        table.add_column("#", justify="right")
        table.add_column("VERB", no_wrap=True)
        table.add_column("TARGET", overflow="fold", ratio=2)
        table.add_column("CHANGE", overflow="fold", ratio=3)
        for i, action in enumerate(plan.actions, 1):
            style = VERB_STYLE[action.verb.value]
            verb = action.verb.value + (" (destructive)" if action.destructive else "")
            table.add_row(
                str(i), f"[{style}]{verb}[/{style}]", action.target, _escape(action.summary)
            )
        parts.append(table)
        for note in plan.notes:
            parts.append(Text(f"note: {note}"))
        for kept in plan.kept:
            parts.append(Text(f"kept: {kept}"))
        if show_diff:
            for action in plan.changes:
                diff = action.diff()
                if diff:
                    parts.append(Text(diff))
        if plan.is_noop:
            parts.append(Text(f"{plan.stage}: nothing to do, already in the desired state"))
    return Group(*parts)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text or "")
