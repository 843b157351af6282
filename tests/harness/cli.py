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
