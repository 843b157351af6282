"""A fault- and latency-injecting HTTPS proxy in front of the test kube-apiserver.

hpkv talks to it with a normal kubeconfig (``server: https://127.0.0.1:<port>``, the harness CA); it forwards every
request to the real apiserver (TLS), streaming responses so watches work. Tests add latency to every
call or make matching calls fail with a given status (409 conflict, 429 with Retry-After, 500...) a
given number of times. Only the transport is changed: the client and the apiserver are real.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kube import KubeHarness

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
}


@dataclass
class KubeFault:
    """Fail matching requests with ``status``; ``times`` counts down (-1 = forever)."""

    status: int
    method: str = "*"
    path: str = ".*"  # regex on the request path (without query)
    times: int = 1
    retry_after: int | None = None

    def matches(self, method: str, path: str) -> bool:
        return (
            self.times != 0
            and self.method in ("*", method)
            and re.search(self.path, path) is not None
        )


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops the SYNs of concurrent clients beyond it, and
    # each dropped SYN costs the client a 1 s retransmit; an API server's backlog is far larger
    request_queue_size = 1024


@dataclass
class KubeProxy:
    kube: KubeHarness
    latency: float = 0.0
    faults: list[KubeFault] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    _server: _ProxyServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> KubeProxy:
        proxy = self
        context = ssl.create_default_context(cafile=str(self.kube.ca_path))

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            upstream: http.client.HTTPSConnection | None = None
            upstream_used = 0.0

            def setup(self) -> None:
                # the TLS handshake happens here, in this connection's own thread (as in a real
                # API server), not in the accepting thread where concurrent clients would queue
                self.handshake_failed = False
                try:
                    self.request.do_handshake()
                except (OSError, ssl.SSLError):
                    self.handshake_failed = True
                super().setup()

            def handle(self) -> None:
                if not self.handshake_failed:
                    super().handle()

            def finish(self) -> None:
                self._drop_upstream()
                super().finish()

            def _drop_upstream(self) -> None:
                if self.upstream is not None:
                    self.upstream.close()
                    self.upstream = None

            def _forward(
                self, body: bytes | None, headers: dict[str, str]
            ) -> http.client.HTTPResponse:
                """Send the request upstream on this client connection's kept-alive connection
                (a fresh one after an idle spell the apiserver may have closed)."""
                if self.upstream is not None and time.monotonic() - self.upstream_used > 20:
                    self._drop_upstream()
                reused = self.upstream is not None
                if self.upstream is None:
                    self.upstream = http.client.HTTPSConnection(
                        "127.0.0.1", proxy.kube.port, context=context, timeout=300
                    )
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=headers)
                    return self.upstream.getresponse()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    self._drop_upstream()
                    if not reused or self.command != "GET":
                        raise
                    return self._forward(body, headers)

            def _handle(self) -> None:
                if proxy.latency:
                    time.sleep(proxy.latency)
                path_only = self.path.split("?", 1)[0]
                fault = proxy._take(self.command, path_only)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if fault is not None:
                    self._fail(fault)
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in _HOP_BY_HOP and k.lower() != "host"
                }
                response = self._forward(body, headers)
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                if response.status in (204, 304) or self.command == "HEAD":
                    # no body (client-go's discovery cache gets 304 Not Modified)
                    self.end_headers()
                    response.read()
                    self._keep_or_drop(response)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while True:
                        chunk = response.read1(65536)
                        if not chunk:
                            break
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:  # the client went away (broken pipe, reset, TLS EOF)
                    self._drop_upstream()
                    self.close_connection = True
                    return
                self._keep_or_drop(response)

            def _keep_or_drop(self, response: http.client.HTTPResponse) -> None:
                if response.will_close or not response.isclosed():
                    self._drop_upstream()
                else:
                    self.upstream_used = time.monotonic()

            def _fail(self, fault: KubeFault) -> None:
                reasons = {
                    409: "Conflict",
                    429: "TooManyRequests",
                    500: "InternalError",
                    503: "ServiceUnavailable",
                }
                status = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": f"injected {fault.status} by the test proxy",
                    "reason": reasons.get(fault.status, "InternalError"),
                    "code": fault.status,
                }
                payload = json.dumps(status).encode()
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if fault.retry_after is not None:
                    self.send_header("Retry-After", str(fault.retry_after))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                return None

        self._server = _ProxyServer(("127.0.0.1", 0), Handler)
        # TLS with the apiserver's own serving certificate (valid for 127.0.0.1): client-go
        # (helm) sends bearer tokens only over TLS
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(
            self.kube.workdir / "apiserver.crt", self.kube.workdir / "apiserver.key"
        )
        self._server.socket = tls.wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )
        threading.Thread(target=self._server.serve_forever, daemon=True, name="kube-proxy").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"https://{host}:{port}"

    def inject(self, fault: KubeFault) -> KubeFault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.injected.clear()
        self.latency = 0.0

    def _take(self, method: str, path: str) -> KubeFault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    if fault.times > 0:
                        fault.times -= 1
                    self.injected.append(f"{method} {path} -> {fault.status}")
                    return fault
        return None

    def write_kubeconfig(
        self, path: Path, *, user: str = "hpkv", context: str = "hpkv-proxy"
    ) -> Path:
        data = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hpkv-proxy",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": self.kube.ca_data(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": self.kube.tokens[user]}}],
            "contexts": [{"name": context, "context": {"cluster": "hpkv-proxy", "user": user}}],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(data))
        return path
