"""Reading container logs: the one seam for pod logs (diagnose detectors and the support bundle).

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
    tail_lines: int = DEFAULT_TAIL_LINES,
    timeout: float = 10.0,
) -> str | None:
    """The last ``tail_lines`` lines of a container's log; None when there is none.

    "None" covers a container that never ran and, with ``previous``, one that never restarted
    (the API answers 400 then). Other failures raise HpkvError.
    """
    directory = os.environ.get(LOGS_DIR_ENV)
    if directory:
        return _from_directory(Path(directory), namespace, pod, container, previous, tail_lines)
    return _from_api(kube, namespace, pod, container, previous, tail_lines, timeout)


def _from_directory(
    root: Path, namespace: str, pod: str, container: str, previous: bool, tail_lines: int
) -> str | None:
    name = f"{container}.previous.log" if previous else f"{container}.log"
    path = root / namespace / pod / name
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    lines = text.splitlines(keepends=True)
    return "".join(lines[-tail_lines:]) if tail_lines > 0 else text


def _from_api(
    kube: KubeClients,
    namespace: str,
    pod: str,
    container: str,
    previous: bool,
    tail_lines: int,
    timeout: float,
) -> str | None:
    from hpkv.kube import is_status, kube_errors

    which = "previous " if previous else ""
    with kube_errors(f"read the {which}log of {namespace}/{pod} container {container}"):
        try:
            return kube.core.read_namespaced_pod_log(
                pod,
                namespace,
                container=container,
                previous=previous,
                tail_lines=tail_lines,
                _request_timeout=timeout,
            )
        except Exception as exc:
            if is_status(exc, 400) or is_status(exc, 404):
                return None  # not started yet, never restarted, or gone
            raise
