"""AWS access: one boto3 session per run, clients with botocore's retry modes, error translation.

Region and credentials follow the usual AWS chain: ``--region``/``--profile`` (or hpkv.yaml,
``HPKV_REGION``/``HPKV_PROFILE``), then ``AWS_REGION``/``AWS_DEFAULT_REGION``/``AWS_PROFILE`` and
the shared config files. Endpoints follow botocore's own ``AWS_ENDPOINT_URL[_<SERVICE>]``
variables, which is how the test harness points hpkv at its local emulator.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import threading
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpkv import __version__
from hpkv.errors import (
    AccessDenied,
    ApiError,
    ConnectionFailed,
    CredentialsError,
    HpkvError,
    NotFound,
    PreconditionFailed,
    UsageError,
)

if TYPE_CHECKING:
    import boto3

    from hpkv.config import Settings
    from hpkv.output.reporter import Reporter

RETRY_MODE_ENV = "HPKV_AWS_RETRY_MODE"
RETRY_MODES = ("standard", "adaptive", "legacy")
DEFAULT_RETRIES = 8
# Seconds to wait for an AWS response before botocore retries the call.
READ_TIMEOUT_ENV = "HPKV_AWS_READ_TIMEOUT"
DEFAULT_READ_TIMEOUT = 60.0

_EXPIRED = {"ExpiredToken", "ExpiredTokenException", "RequestExpired", "TokenRefreshRequired"}
_BAD_CREDENTIALS = {
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "AuthFailure",
}
_DENIED = {
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
    "UnauthorizedException",
    "Forbidden",
}
_NOT_FOUND = {"ResourceNotFound", "ResourceNotFoundException", "NoSuchEntity", "NotFoundException"}
_CONFLICT = {"ResourceInUse", "ResourceInUseException", "ConflictException"}


class AwsClients:
    """Lazily created boto3 clients sharing one session."""

    def __init__(self, settings: Settings, *, reporter: Reporter | None = None) -> None:
        self.settings = settings
        self.reporter = reporter
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    @cached_property
    def session(self) -> boto3.Session:
        import boto3
        import botocore.exceptions

        try:
            session = boto3.Session(
                profile_name=self.settings.profile or None,
                region_name=self.settings.region or None,
            )
        except botocore.exceptions.ProfileNotFound as exc:
            profile = self.settings.profile or getattr(exc, "kwargs", {}).get("profile")
            raise UsageError(
                f"AWS profile '{profile}' is not in your AWS config files",
                fix="pass an existing --profile or fix AWS_PROFILE (see 'aws configure "
                "list-profiles')",
            ) from None
        return session

    @cached_property
    def region(self) -> str:
        region = self.session.region_name
        if not region:
            raise UsageError(
                "no AWS region configured",
                fix="pass --region (e.g. us-west-2), set 'region:' in hpkv.yaml or export AWS_REGION",
            )
        self._check_region(region)
        return region

    def _check_region(self, region: str) -> None:
        """A mistyped region is a usage error naming the closest one; a region botocore does not
        list yet (a new one) is tried after a warning."""
        known = _known_regions()
        if not known or region in known:
            return
        close = difflib.get_close_matches(region, sorted(known), n=1, cutoff=0.75)
        if close:
            raise UsageError(
                f"unknown AWS region '{region}'", fix=f"did you mean --region {close[0]}?"
            )
        if self.reporter is not None:
            self.reporter.warn(f"region '{region}' is not in botocore's region list; trying it")

    def _config(self) -> Any:
        from botocore.config import Config

        return Config(
            retries=self._retries(),
            connect_timeout=10,
            read_timeout=_env_seconds(READ_TIMEOUT_ENV, DEFAULT_READ_TIMEOUT),
            # hpkv status reads side by side: keep a connection per concurrent request
            max_pool_connections=64,
            user_agent_extra=f"hpkv/{__version__}",
        )

    def _retries(self) -> dict[str, Any]:
        """botocore's retry mode (HPKV_AWS_RETRY_MODE) and attempts (AWS_MAX_ATTEMPTS or the
        profile's max_attempts, counting the first call; default 1 + 8 retries)."""
        mode = os.environ.get(RETRY_MODE_ENV, "standard")
        if mode not in RETRY_MODES:
            raise UsageError(
                f"{RETRY_MODE_ENV}={mode} is not a botocore retry mode",
                fix=f"set it to one of {', '.join(RETRY_MODES)}, or unset it (default standard)",
            )
        try:
            total = self.session._session.get_config_variable("max_attempts")
        except ValueError:
            raise UsageError(
                f"AWS_MAX_ATTEMPTS={os.environ.get('AWS_MAX_ATTEMPTS', '')} (or max_attempts in "
                "the AWS profile) is not a whole number",
                fix="set it to a whole number of attempts such as 5, or unset it",
            ) from None
        if total is None:
            return {"mode": mode, "max_attempts": DEFAULT_RETRIES}
        if int(total) < 1:
            raise UsageError(
                f"AWS max_attempts is {total}; at least 1 is needed",
                fix="set AWS_MAX_ATTEMPTS to 1 or more, or unset it",
            )
        return {"mode": mode, "total_max_attempts": int(total)}

    def client(self, service: str) -> Any:
        with self._lock:  # boto3 client creation is not thread-safe
            if service not in self._clients:
                region = self.region
                with translate_errors(f"create the {service} client"):
                    self._clients[service] = self.session.client(
                        service, region_name=region, config=self._config()
                    )
            return self._clients[service]

    def prepare(self, services: Sequence[str]) -> threading.Thread:
        """Build these clients in a background thread, one after another in the order given.

        Building a client is CPU-bound (loading its service model and endpoint rules: ~90 ms for
        SageMaker), so a run that needs several builds the next one while the previous one's call
        is on the network. Errors are left to the caller that needs the client (it raises the
        same error in the foreground).
        """

        def build() -> None:
            for service in services:
                try:
                    self.client(service)
                except Exception:  # reported by whoever uses the client
                    return

        thread = threading.Thread(target=build, daemon=True, name="hpkv-aws-clients")
        thread.start()
        return thread

    @property
    def built(self) -> frozenset[str]:
        """The services whose client exists."""
        return frozenset(self._clients)

    @property
    def sagemaker(self) -> Any:
        return self.client("sagemaker")

    @property
    def eks(self) -> Any:
        return self.client("eks")

    @property
    def iam(self) -> Any:
        return self.client("iam")

    @property
    def sts(self) -> Any:
        return self.client("sts")

    @property
    def s3(self) -> Any:
        return self.client("s3")

    def caller_identity(self) -> dict[str, Any]:
        with translate_errors("sts:GetCallerIdentity"):
            return self.sts.get_caller_identity()


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(
            f"{name}={raw} is not a positive number of seconds",
            fix=f"set {name} to seconds such as 60, or unset it",
        )
    return value


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(exc)


@contextlib.contextmanager
def translate_errors(action: str) -> Iterator[None]:
    """Turn botocore exceptions raised inside the block into one-line HpkvErrors."""
    import botocore.exceptions as bex

    try:
        yield
    except HpkvError:
        raise
    except (bex.NoCredentialsError, bex.PartialCredentialsError):
        raise CredentialsError(
            f"no AWS credentials found (needed to {action})",
            fix="run 'aws configure' or 'aws sso login', pass --profile, or export "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ) from None
    except (bex.SSOTokenLoadError, bex.UnauthorizedSSOTokenError, bex.TokenRetrievalError):
        raise CredentialsError(
            "the AWS SSO session has expired or is missing",
            fix="run 'aws sso login' for your profile and retry",
        ) from None
    except bex.ProfileNotFound as exc:
        raise UsageError(
            f"AWS profile not found: {exc}",
            fix="pass an existing --profile (see 'aws configure list-profiles')",
        ) from None
    except (bex.EndpointConnectionError, bex.ConnectTimeoutError) as exc:
        hint = region_hint(str(getattr(exc, "kwargs", {}).get("endpoint_url") or ""))
        raise ConnectionFailed(
            f"cannot reach the AWS endpoint for {action}: {exc}",
            fix=hint or "check network access, proxy settings and --region",
        ) from None
    except bex.ReadTimeoutError:
        raise ConnectionFailed(
            f"the AWS API did not answer in time ({action})",
            fix="retry; if it persists check network access and the AWS Health Dashboard",
        ) from None
    except bex.ParamValidationError as exc:
        raise UsageError(
            f"invalid request for {action}: {exc}", fix="check the values given"
        ) from None
    except bex.ClientError as exc:
        raise _client_error(exc, action) from None


_AWS_HOST = re.compile(r"^[a-z0-9-]+\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")


def region_hint(endpoint_url: str) -> str | None:
    """'unknown region X, did you mean Y?' for an AWS endpoint URL whose region botocore does not
    know (read from its endpoint data only here, on a failed connection); None otherwise."""
    import urllib.parse

    match = _AWS_HOST.match(urllib.parse.urlsplit(endpoint_url).hostname or "")
    if match is None:
        return None
    region = match.group(1)
    known = _known_regions()
    if not known or region in known:
        return None
    close = difflib.get_close_matches(region, sorted(known), n=1, cutoff=0.75)
    suggestion = f"did you mean --region {close[0]}?" if close else "pass a valid --region"
    return f"'{region}' is not a known AWS region: {suggestion}"


@functools.cache
def _known_regions() -> frozenset[str]:
    """The regions of every partition botocore knows (its small partitions.json: reading the
    full endpoint data would cost 50-130 ms on every run)."""
    import json

    import botocore

    path = Path(botocore.__file__).parent / "data" / "partitions.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(
        region
        for partition in data.get("partitions", [])
        for region in partition.get("regions", {})
        if not region.endswith("-global")
    )


def _client_error(exc: BaseException, action: str) -> HpkvError:
    code = error_code(exc)
    message = error_message(exc)
    if code in _EXPIRED:
        return CredentialsError(
            "the AWS credentials have expired",
            fix="refresh them ('aws sso login' or a new session token) and retry",
        )
    if code in _BAD_CREDENTIALS:
        return CredentialsError(
            f"AWS rejected the credentials ({code})",
            fix="check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --profile, and the clock",
        )
    if code in _DENIED:
        return AccessDenied(
            f"AWS denied {action}: {message}",
            fix="grant the caller this permission (see the README's IAM section, or run "
            "'hpkv diagnose --iam')",
        )
    if code in _NOT_FOUND:
        return NotFound(f"{action}: {message}", fix="check the name and --region")
    if code in _CONFLICT:
        return PreconditionFailed(
            f"{action}: {message}", fix="wait for the operation in progress, then retry"
        )
    if code in (
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
    ):
        return ApiError(
            f"AWS throttled {action} after retries",
            fix="retry later, or set HPKV_AWS_RETRY_MODE=adaptive",
        )
    return ApiError(
        f"{action} failed: {code}: {message}", fix="see the message; rerun with --debug for details"
    )
