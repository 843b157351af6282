"""Run the hpkv CLI in-process with typer's CliRunner (stdout and stderr kept apart)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from typer.testing import CliRunner


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None

    def __str__(self) -> str:
        return f"exit {self.exit_code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_hpkv(
    args: Sequence[str], *, input: str | None = None, env: Mapping[str, str] | None = None
) -> CliResult:
    from hpkv.cli.main import app

    result = CliRunner().invoke(app, list(args), input=input, env=dict(env or {}))
    exception = result.exception if not isinstance(result.exception, SystemExit) else None
    return CliResult(result.exit_code, result.stdout, result.stderr, exception)


def run_on_tty(
    args: Sequence[str], answers: Sequence[tuple[bytes, bytes]], env: Mapping[str, str]
) -> tuple[int, str]:
    """Run ``python -m hpkv ARGS`` on a real pseudo-terminal; each (prompt, reply) in ``answers``
    is typed, in order, once its prompt text has appeared. Returns (exit status, all output)."""
    import os
    import pty
    import select
    import sys
    import time

    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execve(sys.executable, [sys.executable, "-m", "hpkv", *args], dict(env))
    output, pending = b"", list(answers)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
        if pending and pending[0][0] in output:
            os.write(fd, pending.pop(0)[1] + b"\n")
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")
