"""Typed errors raised by the core.

Every error a user can cause is an ``HpkvError``: it carries a one-line cause, a one-line fix and
the exit code the CLI documents. The CLI maps these to output and exit codes in one place
(``hpkv.cli.main``); the core never prints or exits.
"""

from __future__ import annotations


class ExitCode:
    """Exit codes documented in the README."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    INTERRUPTED = 130

    # status commands (Nagios plugin convention)
    STATUS_OK = 0
    STATUS_WARNING = 1
    STATUS_CRITICAL = 2
    STATUS_UNKNOWN = 3


class HpkvError(Exception):
    """An error with a cause and a fix, shown to the user as one line."""

    exit_code: int = ExitCode.FAILURE

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message.rstrip(".")
        self.fix = fix.rstrip(".") if fix else None

    def one_line(self) -> str:
        text = self.message
        if self.fix:
            text = f"{text}. Fix: {self.fix}"
        return " ".join(text.split())


class UsageError(HpkvError):
    """Bad flag value or bad combination of flags."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """hpkv.yaml (or an HPKV_* variable) is unreadable or invalid."""


class ConfirmationRequired(UsageError):
    """A mutation needs confirmation but there is no TTY and no --yes."""


class Aborted(HpkvError):
    """The user declined a confirmation prompt."""


class CredentialsError(HpkvError):
    """AWS credentials are missing, invalid or expired."""


class AccessDenied(HpkvError):
    """An AWS or Kubernetes API refused the caller."""


class NotFound(HpkvError):
    """A named resource (cluster, endpoint, context) does not exist."""


class PreconditionFailed(HpkvError):
    """The target is not in a state that allows the operation."""


class WaitTimeout(HpkvError):
    """A wait ran out of time."""


class ApiError(HpkvError):
    """An AWS, Kubernetes or Helm call failed for a reason the user cannot fix by input alone."""


class ConnectionFailed(HpkvError):
    """An API endpoint could not be reached."""
