"""Progress reporting from the core to the user (stderr).

The core calls ``ctx.reporter``; the CLI installs a :class:`ConsoleReporter`. Tests and library
users get :class:`NullReporter` by default. Spinners and progress bars are drawn only on a terminal.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO, Any, Protocol


class ProgressHandle(Protocol):
    def advance(self, amount: float = 1) -> None: ...

    def update(self, *, description: str | None = None, completed: float | None = None) -> None: ...


class Reporter(Protocol):
    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...

    def step(self, message: str) -> None: ...

    def debug(self, message: str) -> None: ...

    def waiting(self, message: str) -> contextlib.AbstractContextManager[Any]: ...

    def progress(
        self, description: str, total: float | None = None
    ) -> contextlib.AbstractContextManager[ProgressHandle]: ...


class _NullProgress:
    def advance(self, amount: float = 1) -> None:
        return None

    def update(self, *, description: str | None = None, completed: float | None = None) -> None:
        return None


class NullReporter:
    """Records messages; prints nothing. Default for library use and tests."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.messages.append(("info", message))

    def warn(self, message: str) -> None:
        self.messages.append(("warn", message))

    def step(self, message: str) -> None:
        self.messages.append(("step", message))

    def debug(self, message: str) -> None:
        self.messages.append(("debug", message))

    @contextlib.contextmanager
    def waiting(self, message: str) -> Iterator[None]:
        self.messages.append(("wait", message))
        yield

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None = None) -> Iterator[ProgressHandle]:
        self.messages.append(("progress", description))
        yield _NullProgress()


class _RichProgress:
    def __init__(self, progress: Any, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, amount: float = 1) -> None:
        self._progress.advance(self._task, amount)

    def update(self, *, description: str | None = None, completed: float | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if description is not None:
            kwargs["description"] = description
        if completed is not None:
            kwargs["completed"] = completed
        self._progress.update(self._task, **kwargs)


class ConsoleReporter:
    """Writes progress to stderr with rich; animations only on a TTY."""

    def __init__(self, stream: IO[str] | None = None, *, verbosity: int = 0) -> None:
        from hpkv.output import make_console

        self.console = make_console(stream or sys.stderr)
        self.verbosity = verbosity

    @property
    def interactive(self) -> bool:
        return self.console.is_terminal

    def info(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {_escape(message)}")

    def step(self, message: str) -> None:
        self.console.print(f"[cyan]→[/cyan] {_escape(message)}")

    def debug(self, message: str) -> None:
        if self.verbosity > 0:
            self.console.print(f"[dim]{_escape(message)}[/dim]")

    @contextlib.contextmanager
    def waiting(self, message: str) -> Iterator[None]:
        if not self.interactive:
            self.console.print(f"… {_escape(message)}")
            yield
            return
        with self.console.status(_escape(message)):
            yield

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None = None) -> Iterator[ProgressHandle]:
        if not self.interactive:
            self.console.print(f"… {_escape(description)}")
            yield _NullProgress()
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as progress:
            task = progress.add_task(description, total=total)
            yield _RichProgress(progress, task)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
