"""Commands inside pods: ``exec`` (a probe in a container). The one seam for exec, as
:mod:`hpkv.kube.podlogs` is for container logs and :mod:`hpkv.kube.incluster` for HTTP.

On a real cluster exec goes through the API server (the exec subresource over a WebSocket), which
relays it to the node's kubelet. ``HPKV_POD_ROUTES`` (a JSON object mapping ``"<namespace>/<pod>"``
or ``"<namespace>/*"`` to a base URL) sends matching commands to a small HTTP service instead:
``POST <base>/exec`` with ``{"namespace", "pod", "container", "command": [...]}``, answered by
``{"rc": 0, "stdout": "...", "stderr": "..."}``. Tests use it because the test cluster has no
kubelet; an operator can use it to point hpkv at a debugging proxy.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpkv.errors import ApiError, ConnectionFailed
from hpkv.kube.incluster import routes_from_env

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

ROUTES_ENV = "HPKV_POD_ROUTES"


@dataclass(frozen=True)
class ExecResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def _route(namespace: str, pod: str) -> str | None:
    routes = routes_from_env(ROUTES_ENV, '{"team-a/*": "http://127.0.0.1:8099"}')
    return routes.get(f"{namespace}/{pod}") or routes.get(f"{namespace}/*")


def _exit_status(text: str, pod: str) -> int:
    """The command's exit status from the exec error channel (a Status object).

    A failure without an exit code (no kubelet connection, container gone) raises instead.
    """
    try:
        status = json.loads(text) if text else {}
    except ValueError:
        status = {"message": text}
    if not status or status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message"))
            except (TypeError, ValueError):
                break
    raise ConnectionFailed(
        f"exec into pod {pod} failed: {status.get('message') or text}",
        fix="check that the pod is Running and its node's kubelet is reachable from the API server",
    )


class PodIO:
    """Exec into containers, through the API server or the test seam."""

    def __init__(self, kube: KubeClients, *, timeout: float = 30.0) -> None:
        self.kube = kube
        self.timeout = timeout

    # --- exec ----------------------------------------------------------------------------------
    def exec(
        self,
        namespace: str,
        pod: str,
        container: str,
        command: list[str],
        *,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run ``command`` in the container; the exit status is returned, never raised."""
        limit = timeout or self.timeout
        base = _route(namespace, pod)
        if base is not None:
            body = {"namespace": namespace, "pod": pod, "container": container, "command": command}
            text = self._http(base + "/exec", json.dumps(body).encode(), limit)
            try:
                data = json.loads(text)
                return ExecResult(int(data["rc"]), str(data["stdout"]), str(data["stderr"]))
            except (ValueError, KeyError, TypeError):
                raise ApiError(
                    f"{base}/exec answered something that is not an exec result",
                    fix=f"check the {ROUTES_ENV} target",
                ) from None
        return self._stream_exec(namespace, pod, container, command, limit)

    def _stream_exec(
        self, namespace: str, pod: str, container: str, command: list[str], limit: float
    ) -> ExecResult:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import ERROR_CHANNEL

        from hpkv.kube import kube_errors

        with kube_errors(f"exec into pod {namespace}/{pod} (container {container})"):
            try:
                response = stream(
                    self.kube.core.connect_get_namespaced_pod_exec,
                    pod,
                    namespace,
                    container=container,
                    command=command,
                    stderr=True,
                    stdin=False,
                    stdout=True,
                    tty=False,
                    _preload_content=False,
                    _request_timeout=limit,
                )
            except ApiException:
                raise
            except Exception as exc:  # WebSocket handshake and transport errors
                raise ConnectionFailed(
                    f"exec into pod {namespace}/{pod} failed: {exc}",
                    fix="check that the pod is Running and that you may create pods/exec",
                ) from None
            stdout, stderr = [], []
            deadline = time.monotonic() + limit
            try:
                while response.is_open() and time.monotonic() < deadline:
                    response.update(timeout=1)
                    if response.peek_stdout():
                        stdout.append(response.read_stdout())
                    if response.peek_stderr():
                        stderr.append(response.read_stderr())
                if response.is_open():
                    raise ConnectionFailed(
                        f"exec into pod {namespace}/{pod} did not finish within {int(limit)}s",
                        fix="check the pod's health (a hung FUSE mount blocks file access)",
                    )
                rc = _exit_status(response.read_channel(ERROR_CHANNEL), f"{namespace}/{pod}")
            finally:
                response.close()
        return ExecResult(rc, "".join(stdout), "".join(stderr))

    # --- seam ----------------------------------------------------------------------------------
    def _http(self, url: str, body: bytes | None, timeout: float) -> str:
        request = urllib.request.Request(
            url,
            data=body,
            method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace").strip()[:200]
            raise ApiError(
                f"{url} answered {exc.code}: {detail}", fix=f"check the {ROUTES_ENV} target"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectionFailed(
                f"cannot reach {url}: {exc}", fix=f"check the {ROUTES_ENV} target is up"
            ) from None
