"""Reading pod logs (bench runner output, LMCache log lines).

On a real cluster logs come from the API server (``GET .../pods/{name}/log``), which asks the
kubelet. This is the one seam for that access: when ``HPKV_POD_LOGS_DIR`` is set, the log of
container ``C`` of pod ``ns/name`` is read from ``$HPKV_POD_LOGS_DIR/<ns>/<name>.<C>.log``, falling
back to ``<ns>/<name>.log``. Tests use it because the test cluster has no kubelet: a test playing the
kubelet writes the files. An operator can use it to feed saved logs to hpkv.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpkv.errors import NotFound

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

LOGS_DIR_ENV = "HPKV_POD_LOGS_DIR"


class PodLogs:
    def __init__(self, kube: KubeClients) -> None:
        self.kube = kube

    def read(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        since_seconds: int | None = None,
    ) -> str:
        """The pod's log text; NotFound when the pod or its log does not exist (yet)."""
        directory = os.environ.get(LOGS_DIR_ENV)
        if directory:
            return _from_directory(Path(directory), namespace, pod, container)
        return self._from_api(namespace, pod, container, since_seconds)

    def _from_api(
        self, namespace: str, pod: str, container: str | None, since_seconds: int | None
    ) -> str:
        from hpkv.kube import kube_errors

        kwargs: dict[str, object] = {"_preload_content": False}
        if container:
            kwargs["container"] = container
        if since_seconds:
            kwargs["since_seconds"] = max(1, int(since_seconds))
        with kube_errors(f"read the log of pod {namespace}/{pod}"):
            response = self.kube.core.read_namespaced_pod_log(pod, namespace, **kwargs)
            data = response.data if hasattr(response, "data") else response
        if isinstance(data, bytes):
            return data.decode("utf-8", errors="replace")
        return str(data or "")


def _from_directory(root: Path, namespace: str, pod: str, container: str | None) -> str:
    candidates = [root / namespace / f"{pod}.{container}.log"] if container else []
    candidates.append(root / namespace / f"{pod}.log")
    for path in candidates:
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")
    raise NotFound(
        f"no log for pod {namespace}/{pod} in {root}",
        fix=f"write {candidates[-1]} or unset {LOGS_DIR_ENV} to read logs from the API server",
    )
