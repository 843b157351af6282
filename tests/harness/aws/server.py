"""The AWS emulator: moto in server mode on 127.0.0.1 plus hpkv's stateful extensions.

hpkv reaches it through real boto3/botocore serialization: tests set ``AWS_ENDPOINT_URL`` (a
standard botocore setting) to :attr:`AwsEmulator.endpoint_url`. moto 5.2 lacks SageMaker
UpdateCluster/TieredStorageConfig/NodeRecovery and the EKS add-on actions; the extensions in this
package implement them with the real API's rules. Everything else is moto.

Every request is logged (service, action, access key) so tests can count mutating calls; faults
(throttling, 5xx, delays) and latency can be injected per service/action.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.aws.protocol import AwsError, ParsedRequest, error, parse_request, success

READ_PREFIXES = (
    "Describe",
    "List",
    "Get",
    "Simulate",
    "Head",
    "Lookup",
    "Search",
    "Query",
    "BatchGet",
)

# The access keys tests use: the tool's and the harness's own (for seeding), so writes can be told apart.
HPKV_ACCESS_KEY = "AKIAHPKVTOOL00000001"
HARNESS_ACCESS_KEY = "AKIAHARNESS000000001"
SECRET_KEY = "hpkv-test-secret-key-not-real-000000000"


@dataclass
class LoggedCall:
    service: str
    action: str
    access_key: str
    status: int
    at: float

    @property
    def is_write(self) -> bool:
        if self.action.startswith(("GET ", "HEAD ")):
            return False
        if " " in self.action:  # rest-xml "METHOD /path"
            return True
        return not self.action.startswith(READ_PREFIXES)

    def __str__(self) -> str:
        return f"{self.service}:{self.action} -> {self.status}"


@dataclass
class Fault:
    """Inject a failure into matching calls. ``times`` counts down; -1 means forever."""

    service: str
    action: str = "*"
    kind: str = "throttle"  # throttle | server | unavailable | deny | expired | delay | late
    times: int = 1
    seconds: float = 0.0

    def matches(self, service: str, action: str) -> bool:
        return self.times != 0 and self.service in ("*", service) and self.action in ("*", action)


_FAULT_ERRORS = {
    "throttle": ("ThrottlingException", 400),
    "server": ("InternalFailure", 500),
    "unavailable": ("ServiceUnavailable", 503),
    "deny": ("AccessDeniedException", 400),
    "expired": ("ExpiredTokenException", 400),
}


class Extension:
    """A stateful emulation of some actions of one service."""

    service: str = ""

    def __init__(self, emulator: AwsEmulator) -> None:
        self.emulator = emulator

    def handles(self, action: str) -> bool:
        return hasattr(self, _handler_name(action))

    def handle(self, request: ParsedRequest) -> dict[str, Any] | tuple[int, dict[str, Any]]:
        return getattr(self, _handler_name(request.action))(request)

    def reset(self) -> None:
        return None


def _handler_name(action: str) -> str:
    return "op_" + action


class _Middleware:
    def __init__(self, emulator: AwsEmulator, app: Any) -> None:
        self.emulator = emulator
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        if "CONTENT_TYPE" in environ:
            headers["content-type"] = environ["CONTENT_TYPE"]
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "/")
        request = parse_request(method, path, environ.get("QUERY_STRING", ""), headers, body)
        emulator = self.emulator
        if emulator.latency:
            time.sleep(emulator.latency)
        if request is None:
            return self.app(environ, start_response)
        if "authorization" not in headers and request.region:
            # A presigned request (e.g. an EKS token's GetCallerIdentity URL) carries its credential
            # scope in the query; give moto's dispatcher the equivalent header so it routes by service.
            environ["HTTP_AUTHORIZATION"] = (
                f"AWS4-HMAC-SHA256 Credential={request.access_key}/20260101/{request.region}/"
                f"{request.service}/aws4_request, SignedHeaders=host, Signature=presigned"
            )
        fault = emulator._take_fault(request.service, request.action)
        # "late": the call is processed now and its response leaves `seconds` later (a client
        # timeout then retries a call that already took effect)
        late = fault.seconds if fault is not None and fault.kind == "late" else 0.0
        if fault is not None and fault.kind != "late":
            if fault.kind == "delay":
                time.sleep(fault.seconds)
            else:
                code, status = _FAULT_ERRORS[fault.kind]
                if request.service == "s3" and fault.kind == "throttle":
                    # S3 throttles with 503 SlowDown (a HEAD answer carries no error code)
                    code, status = "SlowDown", 503
                if request.protocol == "query":
                    code = {
                        "ThrottlingException": "Throttling",
                        "AccessDeniedException": "AccessDenied",
                    }.get(code, code)
                message = f"injected {fault.kind} fault"
                if fault.kind == "deny":
                    message = (
                        f"User: arn:aws:iam::{emulator.account_id}:user/hpkv is not authorized to "
                        f"perform: {request.service}:{request.action}"
                    )
                elif fault.kind == "expired":
                    message = "The security token included in the request is expired"
                status_code, resp_headers, payload = error(
                    request.protocol, AwsError(code, message, status)
                )
                emulator._log(request, status_code)
                return _respond(start_response, status_code, resp_headers, payload)
        extension = emulator.extensions.get(request.service)
        if extension is not None and extension.handles(request.action):
            status_code, resp_headers, payload = emulator._dispatch(extension, request)
            emulator._log(request, status_code)
            time.sleep(late)
            return _respond(start_response, status_code, resp_headers, payload)
        captured: dict[str, int] = {}

        def _start(
            status: str, response_headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            captured["status"] = int(status.split()[0])
            return start_response(status, response_headers, exc_info)

        result = self.app(environ, _start)
        emulator._log(request, captured.get("status", 0))
        time.sleep(late)
        return result


def _respond(
    start_response: Callable[..., Any], status: int, headers: dict[str, str], body: bytes
) -> list[bytes]:
    reason = {
        200: "OK",
        201: "Created",
        400: "Bad Request",
        404: "Not Found",
        409: "Conflict",
        500: "Internal Server Error",
    }
    start_response(
        f"{status} {reason.get(status, 'Status')}",
        [*headers.items(), ("Content-Length", str(len(body)))],
    )
    return [body]


@dataclass
class AwsEmulator:
    region: str = "us-west-2"
    account_id: str = "123456789012"
    extensions: dict[str, Extension] = field(default_factory=dict)
    calls: list[LoggedCall] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    latency: float = 0.0
    _server: Any = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> AwsEmulator:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        from tests.harness.aws import extensions

        for extension_cls in extensions.all_extensions():
            extension = extension_cls(self)
            self.extensions[extension.service] = extension
        app = _Middleware(self, DomainDispatcherApplication(create_backend_app))

        class QuietHandler(MotoRequestHandler):
            def log(self, *args: Any, **kwargs: Any) -> None:
                return None

        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=QuietHandler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="aws-emulator"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def reset(self) -> None:
        """Forget all state (moto backends and extensions), the call log and faults."""
        import moto.backends
        from moto.core.base_backend import BackendDict  # noqa: F401 - ensures moto is loaded
        from moto.core.models import default_user_config  # noqa: F401

        for name in ("sagemaker", "eks", "iam", "sts", "s3"):
            backend = moto.backends.get_backend(name)
            backend.reset()
        for extension in self.extensions.values():
            extension.reset()
        with self._lock:
            self.calls.clear()
            self.faults.clear()
        self.latency = 0.0

    # --- clients for the tests themselves ------------------------------------------------------
    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(
            service,
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=HARNESS_ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def env(self) -> dict[str, str]:
        """Environment variables that point hpkv (boto3) at the emulator as the tool's identity."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": HPKV_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    # --- call log -------------------------------------------------------------------------------
    def _log(self, request: ParsedRequest, status: int) -> None:
        with self._lock:
            self.calls.append(
                LoggedCall(request.service, request.action, request.access_key, status, time.time())
            )

    def mark(self) -> int:
        with self._lock:
            return len(self.calls)

    def calls_since(
        self, mark: int, *, access_key: str | None = HPKV_ACCESS_KEY
    ) -> list[LoggedCall]:
        with self._lock:
            calls = list(self.calls[mark:])
        return [c for c in calls if access_key is None or c.access_key == access_key]

    def writes_since(
        self, mark: int, *, access_key: str | None = HPKV_ACCESS_KEY
    ) -> list[LoggedCall]:
        return [c for c in self.calls_since(mark, access_key=access_key) if c.is_write]

    # --- faults ---------------------------------------------------------------------------------
    def inject(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def _take_fault(self, service: str, action: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(service, action):
                    if fault.times > 0:
                        fault.times -= 1
                    return fault
        return None

    def _dispatch(
        self, extension: Extension, request: ParsedRequest
    ) -> tuple[int, dict[str, str], bytes]:
        from tests.harness.aws.protocol import (
            query_success,
            structured_query_params,
            validate_params,
        )

        try:
            if request.protocol == "query":
                request.params = structured_query_params(
                    request.service, request.action, request.params
                )
            validate_params(request.service, request.action, request.params)
            result = extension.handle(request)
        except AwsError as exc:
            return error(request.protocol, exc)
        status = 200
        if isinstance(result, tuple):
            status, result = result
        if request.protocol == "query":
            return query_success(request.service, request.action, result)
        return success(request.protocol, result, status)
