"""HTTP to services and pods inside the cluster (Curvine master API, vLLM/LMCache ``/metrics``).

On a real cluster requests go through the API server's service/pod proxy
(``/api/v1/namespaces/{ns}/services/{name}:{port}/proxy/{path}``), so no port-forward or network
path to the pods is needed. This is the one seam for that access: ``HPKV_INCLUSTER_ROUTES`` (a JSON
object mapping ``"<namespace>/<services|pods>/<name>:<port>"`` to a base URL) sends matching requests
straight to that URL instead. Tests use it because kube-apiserver refuses to proxy to loopback
addresses and the test cluster has no pods; an operator can use it with ``kubectl port-forward``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpkv.errors import ConnectionFailed, UsageError

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

ROUTES_ENV = "HPKV_INCLUSTER_ROUTES"


@dataclass
class HttpResponse:
    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def routes_from_env(variable: str, example: str) -> dict[str, str]:
    """A JSON object of target key -> base URL from an environment variable ({} when unset)."""
    raw = os.environ.get(variable)
    if not raw:
        return {}
    try:
        routes = json.loads(raw)
    except ValueError:
        raise UsageError(f"{variable} is not valid JSON", fix=f"set it to e.g. {example}") from None
    if not isinstance(routes, dict):
        raise UsageError(f"{variable} must be a JSON object", fix="map target keys to base URLs")
    return {str(k): str(v) for k, v in routes.items()}


def _routes() -> dict[str, str]:
    return routes_from_env(
        ROUTES_ENV, '{"curvine/services/curvine-master:9000": "http://127.0.0.1:9000"}'
    )


def route(namespace: str, kind: str, name: str, port: int | str) -> str | None:
    """The base URL ``HPKV_INCLUSTER_ROUTES`` maps this service/pod port to, if any."""
    return _routes().get(f"{namespace}/{kind}/{name}:{port}")


class InClusterHttp:
    def __init__(self, kube: KubeClients, *, timeout: float = 10.0) -> None:
        self.kube = kube
        self.timeout = timeout

    def request(
        self,
        namespace: str,
        kind: str,
        name: str,
        port: int | str,
        path: str,
        *,
        method: str = "GET",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> HttpResponse:
        if kind not in ("services", "pods"):
            raise ValueError(f"kind must be services or pods, not {kind}")
        path = path.lstrip("/")
        key = f"{namespace}/{kind}/{name}:{port}"
        base = _routes().get(key)
        if base is not None:
            return self._direct(base.rstrip("/") + "/" + path, method, body, headers, timeout)
        return self._proxied(namespace, kind, name, port, path, method, body, headers, timeout)

    def get(
        self, namespace: str, kind: str, name: str, port: int | str, path: str, **kwargs: Any
    ) -> HttpResponse:
        return self.request(namespace, kind, name, port, path, **kwargs)

    def _direct(
        self,
        url: str,
        method: str,
        body: bytes | None,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> HttpResponse:
        request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                return HttpResponse(
                    response.status, response.read().decode("utf-8", errors="replace")
                )
        except urllib.error.HTTPError as exc:
            return HttpResponse(exc.code, exc.read().decode("utf-8", errors="replace"))
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectionFailed(
                f"cannot reach {url}: {exc}", fix="check the route and that the target is up"
            ) from None

    def _proxied(
        self,
        namespace: str,
        kind: str,
        name: str,
        port: int | str,
        path: str,
        method: str,
        body: bytes | None,
        headers: dict[str, str] | None,
        timeout: float | None,
    ) -> HttpResponse:
        from hpkv.kube import kube_errors

        api = self.kube.api_client
        resource_path = f"/api/v1/namespaces/{namespace}/{kind}/{name}:{port}/proxy/{path}"
        with kube_errors(f"reach {kind[:-1]} {namespace}/{name}:{port} through the API proxy"):
            method_, url, header_params, body_, _post = api.param_serialize(
                method=method,
                resource_path=resource_path,
                header_params={"Accept": "*/*", **(headers or {})},
                body=body.decode() if body else None,
                auth_settings=["BearerToken"],
            )
            response = api.call_api(
                method_,
                url,
                header_params=header_params,
                body=body_,
                _request_timeout=timeout or self.timeout,
            )
            data = response.read() or b""
        return HttpResponse(response.status, data.decode("utf-8", errors="replace"))
