"""Reading container logs: the one seam for pod logs (diagnose detectors, the support bundle, the
bench runner's output, the L2 stage's LMCache start-up scan). Exec into pods is
:mod:`hpkv.kube.podio`; HTTP to pods and services is :mod:`hpkv.kube.incluster`.

On a cluster the logs come from the API server (``GET .../pods/{name}/log``, served by the node's
kubelet). ``HPKV_POD_LOGS_DIR`` names a directory to read them from instead, laid out as
``<namespace>/<pod>/<container>.log`` (current) and ``<container>.previous.log`` (the previous
instance); a missing file means "no such log". Tests use it because the test cluster has no
kubelets; an operator can point it at logs saved earlier (``kubectl logs > ...``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpkv.errors import NotFound

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

LOGS_DIR_ENV = "HPKV_POD_LOGS_DIR"
DEFAULT_TAIL_LINES = 1000


def read_log(
    kube: KubeClients,
    namespace: str,
    pod: str,
    container: str,
    *,
    previous: bool = False,
    tail_lines: int | None = DEFAULT_TAIL_LINES,
    since_seconds: int | None = None,
    limit_bytes: int | None = None,
    timeout: float = 10.0,
) -> str | None:
    """The last ``tail_lines`` lines (all with None) of a container's log, cut to its first
    ``limit_bytes`` (as the API applies them); None when there is none.

    "None" covers a container that never ran and, with ``previous``, one that never restarted
    (the API answers 400 then). Other failures raise HpkvError. ``tail_lines=None`` with
    ``limit_bytes`` reads the start of the log (start-up messages).
    """
    directory = os.environ.get(LOGS_DIR_ENV)
    if directory:
        text = _from_directory(Path(directory), namespace, pod, container, previous, tail_lines)
        if text is not None and limit_bytes:
            text = text.encode()[:limit_bytes].decode("utf-8", errors="ignore")
        return text
    return _from_api(
        kube, namespace, pod, container, previous, tail_lines, since_seconds, limit_bytes, timeout
    )


def log_path(
    root: Path, namespace: str, pod: str, container: str, *, previous: bool = False
) -> Path:
    name = f"{container}.previous.log" if previous else f"{container}.log"
    return root / namespace / pod / name


def _from_directory(
    root: Path, namespace: str, pod: str, container: str, previous: bool, tail_lines: int | None
) -> str | None:
    path = log_path(root, namespace, pod, container, previous=previous)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    if not tail_lines:
        return text
    return "".join(text.splitlines(keepends=True)[-tail_lines:])


def _from_api(
    kube: KubeClients,
    namespace: str,
    pod: str,
    container: str,
    previous: bool,
    tail_lines: int | None,
    since_seconds: int | None,
    limit_bytes: int | None,
    timeout: float,
) -> str | None:
    from hpkv.kube import is_status, kube_errors

    kwargs: dict[str, object] = {"container": container, "previous": previous}
    if tail_lines:
        kwargs["tail_lines"] = tail_lines
    if limit_bytes:
        kwargs["limit_bytes"] = limit_bytes
    if since_seconds:
        kwargs["since_seconds"] = max(1, int(since_seconds))
    which = "previous " if previous else ""
    with kube_errors(f"read the {which}log of {namespace}/{pod} container {container}"):
        try:
            return kube.core.read_namespaced_pod_log(
                pod, namespace, _request_timeout=timeout, **kwargs
            )
        except Exception as exc:
            if is_status(exc, 400) or is_status(exc, 404):
                return None  # not started yet, never restarted, or gone
            raise


class PodLogs:
    """Whole logs for callers that need them (the bench): NotFound when there is none."""

    def __init__(self, kube: KubeClients) -> None:
        self.kube = kube

    def read(
        self,
        namespace: str,
        pod: str,
        *,
        container: str,
        since_seconds: int | None = None,
    ) -> str:
        text = read_log(
            self.kube,
            namespace,
            pod,
            container,
            tail_lines=None,
            since_seconds=since_seconds,
            timeout=30.0,
        )
        if text is None:
            raise NotFound(
                f"no log for container {container} of pod {namespace}/{pod}",
                fix="check that the pod exists and has started",
            )
        return text
