"""The run context: resolved settings, run options and lazily created API clients.

Every stage receives a :class:`RunContext`. Clients are created on first use, so commands that do
not need AWS, Kubernetes or Helm never import boto3, kubernetes or pyhelm3.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from hpkv.errors import UsageError
from hpkv.output.reporter import NullReporter, Reporter

if TYPE_CHECKING:
    from hpkv.aws import AwsClients
    from hpkv.config import Settings
    from hpkv.helm import HelmClient
    from hpkv.kube import KubeClients


@dataclass
class RunOptions:
    """Per-invocation behaviour flags (not stored in hpkv.yaml)."""

    dry_run: bool = False
    yes: bool = False
    wait: bool | None = None  # None: the command's default; True/False: --wait/--no-wait
    timeout: float = 1800.0  # seconds, for every wait of one command
    verbose: int = 0
    debug: bool = False


def parse_duration(value: str | float | int | None, *, default: float) -> float:
    """'90', '90s', '15m', '1h', '500ms' -> seconds."""
    if value is None or value == "":
        return default
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        for suffix in ("ms", "s", "m", "h"):
            if text.endswith(suffix):
                number, scale = text[: -len(suffix)], units[suffix]
                break
        else:
            number, scale = text, 1.0
        try:
            seconds = float(number) * scale
        except ValueError:
            raise UsageError(
                f"invalid duration '{value}'", fix="use a duration such as 900, 90s, 15m or 1h"
            ) from None
    if seconds <= 0:
        raise UsageError(f"duration '{value}' must be positive", fix="use a value such as 15m")
    return seconds


def poll_interval(default: float = 15.0) -> float:
    """Seconds between status polls; HPKV_POLL_INTERVAL overrides (tests use a small value)."""
    import os

    try:
        value = float(os.environ.get("HPKV_POLL_INTERVAL", default))
    except ValueError:
        return default
    return value if value > 0 else default


T = TypeVar("T")


class _Entry:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class ReadCache:
    """Results of shared reads for one health run, loaded once even when threads ask together.

    Errors are remembered too: every check that needs a read which failed reports the same cause
    without calling the API again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        with self._lock:
            entry = self._entries.get(key)
            owner = entry is None
            if entry is None:
                entry = self._entries[key] = _Entry()
        if owner:
            try:
                entry.value = load()
            except BaseException as exc:
                entry.error = exc
            finally:
                entry.done.set()
        else:
            entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.value


class RunContext:
    def __init__(
        self,
        settings: Settings,
        options: RunOptions | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        self.settings = settings
        self.options = options or RunOptions()
        self.reporter: Reporter = reporter or NullReporter()
        self._lock = threading.Lock()
        self.reads: ReadCache | None = None

    def memo(self, key: Hashable, load: Callable[[], T]) -> T:
        """``load()``, shared by every caller with the same key inside :meth:`shared_reads`."""
        cache = self.reads
        return load() if cache is None else cache.get(key, load)

    @contextlib.contextmanager
    def shared_reads(self) -> Iterator[None]:
        """Memoize shared reads for the block (nested blocks share the outer cache).

        Only read-only runs (status, diagnose) use this; plans and waits always read afresh.
        """
        if self.reads is not None:
            yield
            return
        self.reads = ReadCache()
        try:
            yield
        finally:
            self.reads = None

    def require_cluster(self) -> str:
        cluster = self.settings.cluster
        if not cluster:
            raise UsageError(
                "no HyperPod cluster given",
                fix="pass --cluster NAME, set 'cluster:' in hpkv.yaml, or export HPKV_CLUSTER",
            )
        return cluster

    @cached_property
    def aws(self) -> AwsClients:
        from hpkv.aws import AwsClients

        return AwsClients(self.settings, reporter=self.reporter)

    @cached_property
    def kube(self) -> KubeClients:
        from hpkv import reads
        from hpkv.kube import KubeClients

        return KubeClients(
            self.settings,
            aws=lambda: self.aws,
            reporter=self.reporter,
            clusters=lambda: (reads.hyperpod_cluster(self), reads.eks_cluster(self)),
        )

    @cached_property
    def helm(self) -> HelmClient:
        from hpkv.helm import HelmClient

        return HelmClient(self.settings, kube=self.kube, reporter=self.reporter)
