"""Helm access through pyhelm3 and the real ``helm`` binary (v3.8+ or v4).

pyhelm3 is async; this wrapper runs each call to completion so the stages stay synchronous. It uses
pyhelm3's idempotent release handling: :meth:`HelmClient.needs_upgrade` says whether a release's
chart or values differ (so a converged release is never upgraded), and :meth:`HelmClient.ensure`
installs or upgrades, recovering releases stuck in pending states.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import shutil
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hpkv.errors import ApiError, ConnectionFailed, HpkvError, NotFound, PreconditionFailed

if TYPE_CHECKING:
    from hpkv.config import Settings
    from hpkv.kube import KubeClients
    from hpkv.output.reporter import Reporter

T = TypeVar("T")


class HelmClient:
    def __init__(
        self, settings: Settings, *, kube: KubeClients, reporter: Reporter | None = None
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.reporter = reporter

    @cached_property
    def binary(self) -> str:
        configured = self.settings.get("helm")
        candidate = configured or shutil.which("helm")
        if not candidate or not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            raise PreconditionFailed(
                "the helm binary was not found"
                + (f" at {configured}" if configured else " on PATH"),
                fix="install helm (v3.8+ or v4) or set 'helm: /path/to/helm' in hpkv.yaml (HPKV_HELM)",
            )
        return candidate

    @cached_property
    def client(self) -> Any:
        from pyhelm3 import Client

        kubeconfig, context = self.kube.kubeconfig_for_tools()
        return Client(
            executable=self.binary,
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            kubecontext=context,
            default_timeout="10m",
        )

    def run(self, coroutine: Coroutine[Any, Any, T], action: str) -> T:
        import asyncio  # here: hpkv status reads stored releases without it

        with helm_errors(action):
            return asyncio.run(coroutine)

    # --- charts ---------------------------------------------------------------------------------
    def chart(self, chart_ref: str, *, repo: str | None = None, version: str | None = None) -> Any:
        return self.run(
            self.client.get_chart(chart_ref, repo=repo, version=version),
            f"fetch chart {chart_ref}{' ' + version if version else ''}",
        )

    # --- releases -------------------------------------------------------------------------------
    def current_revision(self, release: str, namespace: str) -> Any | None:
        from pyhelm3.errors import ReleaseNotFoundError

        try:
            return self.run(
                self.client.get_current_revision(release, namespace=namespace),
                f"read release {namespace}/{release}",
            )
        except NotFound:
            return None
        except HpkvError as exc:
            if isinstance(exc.__cause__, ReleaseNotFoundError):
                return None
            raise

    def release_values(self, revision: Any) -> dict[str, Any]:
        return self.run(revision.values(), "read release values")

    def needs_upgrade(self, revision: Any | None, chart: Any, values: dict[str, Any]) -> bool:
        return self.run(
            self.client.should_install_or_upgrade_release(revision, chart, values),
            "compare release values",
        )

    def ensure(
        self,
        release: str,
        chart: Any,
        values: dict[str, Any],
        *,
        namespace: str,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Any:
        return self.run(
            self.client.ensure_release(
                release,
                chart,
                values,
                namespace=namespace,
                create_namespace=True,
                atomic=False,
                wait=wait,
                timeout=f"{int(timeout)}s" if timeout else None,
            ),
            f"install or upgrade release {namespace}/{release}",
        )

    def uninstall(self, release: str, namespace: str, *, wait: bool = False) -> None:
        self.run(
            self.client.uninstall_release(release, namespace=namespace, wait=wait),
            f"uninstall release {namespace}/{release}",
        )

    def template(
        self, chart: Any, release: str, values: dict[str, Any], namespace: str
    ) -> list[dict[str, Any]]:
        return list(
            self.run(
                self.client.template_resources(chart, release, values, namespace=namespace),
                f"render chart for {namespace}/{release}",
            )
        )


@contextlib.contextmanager
def helm_errors(action: str) -> Iterator[None]:
    from pyhelm3 import errors

    try:
        yield
    except HpkvError:
        raise
    except errors.ReleaseNotFoundError as exc:
        raise NotFound(
            f"{action}: release not found", fix="check the release name and namespace"
        ) from exc
    except errors.ChartNotFoundError as exc:
        raise NotFound(
            f"{action}: chart not found ({_stderr(exc)})",
            fix="check the chart repository URL and chart version in hpkv.yaml",
        ) from exc
    except errors.ConnectionError as exc:
        raise ConnectionFailed(
            f"helm could not reach the Kubernetes API to {action}: {_stderr(exc)}",
            fix="check --context/--kubeconfig and network access",
        ) from exc
    except errors.Error as exc:
        raise ApiError(
            f"helm failed to {action}: {_stderr(exc)}",
            fix="see the helm message; rerun with --debug",
        ) from exc
    except FileNotFoundError as exc:
        raise PreconditionFailed(
            f"the helm binary could not be run: {exc}",
            fix="install helm or set 'helm:' in hpkv.yaml",
        ) from exc


@dataclass(frozen=True)
class StoredRelease:
    """A release's newest revision as Helm stores it, read without running helm."""

    name: str
    namespace: str
    revision: int
    status: str
    chart_name: str
    chart_version: str
    values: dict[str, Any]


def stored_release(objects: list[Any]) -> StoredRelease | None:
    """The newest revision among a release's storage objects (the Secrets of Helm's default
    driver, or the ConfigMaps of ``HELM_DRIVER=configmap``), or None when there are none.

    Helm 3 and 4 store each revision as ``sh.helm.release.v1.<name>.v<n>`` labelled
    ``owner=helm,name=<name>,version=<n>``, its ``release`` key holding base64(gzip(JSON)) (base64
    once more inside a Secret). One list call replaces ``helm status`` + ``helm get values`` +
    ``helm get metadata`` (three processes and some twenty API requests each) in health runs.
    """
    if not objects:
        return None
    newest = max(objects, key=lambda o: int((o.metadata.labels or {}).get("version") or 0))
    raw: Any = (newest.data or {}).get("release") or ""
    try:
        if type(newest).__name__ == "V1Secret":
            raw = base64.b64decode(raw)  # the API's base64 of Secret data
        data = base64.b64decode(raw)  # Helm's own encoding
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        release = json.loads(data)
    except (ValueError, OSError) as exc:
        raise ApiError(
            f"cannot read Helm release {newest.metadata.namespace}/{newest.metadata.name}: {exc}",
            fix="check it with 'helm status'; the storage object may be corrupt",
        ) from None
    metadata = (release.get("chart") or {}).get("metadata") or {}
    return StoredRelease(
        name=str(release.get("name", "")),
        namespace=str(release.get("namespace") or newest.metadata.namespace),
        revision=int(release.get("version") or 0),
        status=str((release.get("info") or {}).get("status", "unknown")),
        chart_name=str(metadata.get("name", "")),
        chart_version=str(metadata.get("version", "")),
        values=dict(release.get("config") or {}),
    )


def _stderr(exc: Any) -> str:
    raw = getattr(exc, "stderr", b"") or b""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else str(exc)
