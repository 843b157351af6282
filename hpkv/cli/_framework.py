"""The CLI's framework: global options accepted anywhere, and errors mapped to exit codes in one place.

Global options (``--cluster``, ``--region``, ``-o`` ...) are accepted after a subcommand as well as
before it, as kubectl's are: :class:`HpkvGroup` moves them to the front before parsing. It also
turns every failure into one line on stderr with the documented exit code; ``--debug`` adds the
traceback (never local variables).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import typer
from typer.core import TyperGroup

from hpkv.errors import ExitCode, HpkvError

PROG = "hpkv"

# name -> takes a value
GLOBAL_OPTIONS: dict[str, bool] = {
    "--config": True,
    "--region": True,
    "--profile": True,
    "--cluster": True,
    "--kubeconfig": True,
    "--context": True,
    "--output": True,
    "-o": True,
    "--dry-run": False,
    "--yes": False,
    "-y": False,
    "--wait": False,
    "--no-wait": False,
    "--timeout": True,
    "--verbose": False,
    "-v": False,
    "--debug": False,
}
_SHORT_WITH_VALUE = {"-o"}
_SHORT_FLAGS = {"-y", "-v"}

# Leaf commands whose exit code is a Nagios state: any error is UNKNOWN (3).
STATUS_COMMANDS = {"status", "diagnose"}


@dataclass
class Invocation:
    """What the hoisting pass learned about argv (used for error handling)."""

    command_path: list[str] = field(default_factory=list)
    debug: bool = False

    @property
    def is_status(self) -> bool:
        return bool(self.command_path) and self.command_path[-1] in STATUS_COMMANDS


def split_global_options(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate global options (wherever they are) from the rest, keeping order within each."""
    hoisted: list[str] = []
    rest: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg == "--":
            rest.extend(items[i:])
            break
        name, has_inline, _value = arg.partition("=")
        if arg.startswith("--") and name in GLOBAL_OPTIONS:
            if GLOBAL_OPTIONS[name] and not has_inline:
                hoisted.append(arg)
                if i + 1 < len(items):
                    hoisted.append(items[i + 1])
                    i += 1
            else:
                hoisted.append(arg)
        elif arg in _SHORT_FLAGS or arg in _SHORT_WITH_VALUE:
            hoisted.append(arg)
            if arg in _SHORT_WITH_VALUE and i + 1 < len(items):
                hoisted.append(items[i + 1])
                i += 1
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            hoisted.append(arg)  # -ojson
        elif arg.startswith("-v") and len(arg) > 2 and set(arg[1:]) == {"v"}:
            hoisted.append(arg)  # -vv
        else:
            rest.append(arg)
        i += 1
    return hoisted, rest


class HpkvGroup(TyperGroup):
    """Root command group: hoists global options and owns error -> exit-code mapping."""

    invocation: Invocation = Invocation()

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if (args and GLOBAL_OPTIONS.get(args[-1])) or (args and args[-1] in _SHORT_WITH_VALUE):
            # hoisted to the front it would swallow the subcommand's name as its value
            from typer._click.exceptions import UsageError as ClickUsageError

            raise ClickUsageError(f"Option '{args[-1]}' requires an argument", ctx=ctx)
        hoisted, rest = split_global_options(args)
        self.invocation = Invocation(
            command_path=self._command_path(rest), debug="--debug" in hoisted
        )
        return super().parse_args(ctx, hoisted + rest)

    def _command_path(self, rest: Sequence[str]) -> list[str]:
        path: list[str] = []
        group: Any = self
        for token in rest:
            if token.startswith("-"):
                continue
            commands = getattr(group, "commands", None)
            if not commands or token not in commands:
                break
            path.append(token)
            group = commands[token]
        return path

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        from typer._click import exceptions as click_exceptions

        argv = list(sys.argv[1:] if args is None else args)
        self.invocation = Invocation(
            command_path=self._command_path(split_global_options(argv)[1]),
            debug="--debug" in argv or os.environ.get("HPKV_DEBUG") == "1",
        )
        code: int
        try:
            result = super().main(
                argv,
                prog_name=prog_name or PROG,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            code = result if isinstance(result, int) else ExitCode.OK
            if code == ExitCode.INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130)
                _fail(
                    "interrupted. Fix: rerun the same command to continue; every stage is idempotent"
                )
        except click_exceptions.UsageError as exc:
            code = self._usage_error(exc)
        except click_exceptions.ClickException as exc:
            _fail(exc.format_message())
            code = exc.exit_code
        except typer.Abort:
            _fail("aborted")
            code = ExitCode.FAILURE
        except HpkvError as exc:
            if self.invocation.debug:
                traceback.print_exc(file=sys.stderr)
            _fail(exc.one_line())
            code = ExitCode.STATUS_UNKNOWN if self.invocation.is_status else exc.exit_code
        except KeyboardInterrupt:
            _fail("interrupted. Fix: rerun the same command to continue; every stage is idempotent")
            code = ExitCode.INTERRUPTED
        except Exception as exc:
            if self.invocation.debug:
                traceback.print_exc(file=sys.stderr)
            detail = " ".join(str(exc).split())[:300]
            _fail(
                f"internal error: {type(exc).__name__}: {detail}. Fix: rerun with --debug for the "
                "traceback and report it"
            )
            code = ExitCode.STATUS_UNKNOWN if self.invocation.is_status else ExitCode.FAILURE
        if standalone_mode:
            sys.exit(code)
        return code

    def _usage_error(self, exc: Any) -> int:
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            sys.stdout.write(ctx.get_help() + "\n")
            return ExitCode.OK
        where = ctx.command_path if ctx is not None else PROG
        message = " ".join(exc.format_message().split()).rstrip(".")
        _fail(f"{message}. Fix: see '{where} --help'")
        return ExitCode.STATUS_UNKNOWN if self.invocation.is_status else ExitCode.USAGE


def _fail(message: str) -> None:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.stderr.flush()
