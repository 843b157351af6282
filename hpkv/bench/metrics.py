"""Worker-pod metrics around each scenario, per-tier hit rates, and LMCache log lines.

Snapshots come from each worker pod's ``/metrics`` through the API server's pod proxy
(:class:`hpkv.kube.incluster.InClusterHttp`), or straight from URLs when the bench runs against
URLs only. Parsing and the tier arithmetic are the runner's (one implementation, stdlib only).
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from hpkv.bench.runner import delta, parse_prometheus, snapshot, tier_stats
from hpkv.errors import HpkvError

if TYPE_CHECKING:
    from hpkv.kube import KubeClients

Snapshot = dict[str, float]


class MetricsScraper:
    """Snapshots of several pods' ``/metrics``; a pod that cannot be scraped gives None."""

    def __init__(self, fetch: Callable[[str], str | None], source: str) -> None:
        self._fetch = fetch
        self.source = source
        self.errors: dict[str, str] = {}

    @classmethod
    def through_cluster(cls, kube: KubeClients, namespace: str, port: int) -> MetricsScraper:
        from hpkv.kube.incluster import InClusterHttp

        http = InClusterHttp(kube, timeout=15.0)

        def fetch(pod: str) -> str | None:
            response = http.get(namespace, "pods", pod, port, "/metrics")
            return response.text if response.status == 200 else None

        return cls(fetch, "pod-proxy")

    @classmethod
    def direct(cls, urls: dict[str, str]) -> MetricsScraper:
        def fetch(pod: str) -> str | None:
            try:
                with urllib.request.urlopen(urls[pod].rstrip("/") + "/metrics", timeout=15) as r:
                    return r.read().decode("utf-8", errors="replace")
            except (urllib.error.URLError, OSError):
                return None

        return cls(fetch, "direct")

    def snapshot(self, pods: Iterable[str]) -> dict[str, Snapshot | None]:
        out: dict[str, Snapshot | None] = {}
        for pod in pods:
            try:
                text = self._fetch(pod)
            except HpkvError as exc:
                self.errors[pod] = exc.one_line()
                text = None
            out[pod] = snapshot(parse_prometheus(text)) if text else None
            if text is None and pod not in self.errors:
                self.errors[pod] = "/metrics not available"
        return out


def scenario_metrics(
    before: dict[str, Snapshot | None], after: dict[str, Snapshot | None], source: str
) -> dict[str, Any]:
    """Per-pod deltas and tier figures, plus the sum over pods."""
    pods: dict[str, Any] = {}
    total: dict[str, float] = {}
    for pod, start in before.items():
        end = after.get(pod)
        if start is None or end is None:
            pods[pod] = None
            continue
        d = delta(start, end)
        for key, value in d.items():
            total[key] = total.get(key, 0.0) + value
        pods[pod] = {"before": start, "after": end, "delta": d, "tiers": tier_stats(d)}
    return {
        "source": source,
        "pods": pods,
        "tiers": tier_stats(total) if total else None,
    }


# --- LMCache log lines (lmcache/v1/cache_engine.py, integration/vllm/vllm_v1_adapter.py) --------

_RETRIEVED = re.compile(
    r"\[req_id=(?P<rid>[^\]\s]+)[^\]]*\] Retrieved (?P<retrieved>\d+) out of (?P<required>\d+)"
    r" (?:required tokens \(from (?P<total>\d+) total tokens\)|out of total (?P<total2>\d+) tokens)"
    r"(?:\. size: (?P<size>[\d.]+) gb, cost (?P<cost>[\d.]+) ms)?",
    re.IGNORECASE,
)
_LOOKUP = re.compile(
    r"Reqid: (?P<rid>[^,\s]+), Total tokens (?P<total>\d+), (?:Inference Engine computed tokens: "
    r"(?P<computed>\d+), )?LMCache hit tokens: (?P<hit>\d+), need to load: (?P<load>-?\d+)"
)


def parse_lmcache_log(text: str) -> dict[str, dict[str, Any]]:
    """LMCache's per-request lines, keyed by its request id (vLLM's internal id)."""
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if "Retrieved" in line:
            match = _RETRIEVED.search(line)
            if match:
                entry = found.setdefault(match["rid"], {})
                entry["retrievedTokens"] = int(match["retrieved"])
                if match["cost"]:
                    entry["retrieveMs"] = float(match["cost"])
                    entry["retrieveBytes"] = float(match["size"]) * 1024**3
        elif "LMCache hit tokens" in line:
            match = _LOOKUP.search(line)
            if match:
                entry = found.setdefault(match["rid"], {})
                entry["lmcacheHitTokens"] = int(match["hit"])
                entry["needToLoad"] = max(0, int(match["load"]))
    return found


def attach_log_figures(records: list[dict[str, Any]], entries: dict[str, dict[str, Any]]) -> int:
    """Fill a request's missing hit/L2 figures from its LMCache log lines; returns how many."""
    filled = 0
    for record in records:
        rid = record.get("id")
        if not rid:
            continue
        entry = next(
            (e for key, e in entries.items() if key == rid or key.startswith(rid + "-")), None
        )
        if entry is None:
            continue
        changed = False
        if record.get("l2ReadMs") is None and "retrieveMs" in entry:
            record["l2ReadMs"] = entry["retrieveMs"]
            record["l2ReadSource"] = "log"
            changed = True
        if record.get("l2ReadBytes") is None and "retrieveBytes" in entry:
            record["l2ReadBytes"] = entry["retrieveBytes"]
            changed = True
        if record.get("lmcacheHitTokens") is None and "lmcacheHitTokens" in entry:
            record["lmcacheHitTokens"] = entry["lmcacheHitTokens"]
            changed = True
        if record.get("hitTokens") is None and "needToLoad" in entry:
            record["hitTokens"] = entry["needToLoad"]
            changed = True
        filled += changed
    return filled
