"""``hpkv bench compare A.json B.json``: side-by-side deltas (B - A) with confidence intervals.

Latency rows compare percentiles of the raw per-request samples; their 95% intervals come from a
percentile bootstrap that resamples A's and B's requests independently (seeded, so the same files
give the same intervals). A row is significant when its interval excludes zero. Hit rates and
throughput are single figures per run and have no interval.
"""

from __future__ import annotations

from typing import Any

from hpkv.bench import SCENARIOS, results
from hpkv.bench.stats import CI_LEVEL, clean, percentile

ENV_KEYS = ("model", "image", "instanceType", "replicas", "readyReplicas", "routingStrategy")


def _samples(doc: dict[str, Any], **match: Any) -> list[float]:
    return clean(
        r.get("ttftMs")
        for r in doc["requests"]
        if r.get("ok") and all(r.get(k) == v for k, v in match.items())
    )


def _field(doc: dict[str, Any], key: str, **match: Any) -> list[float]:
    return clean(
        r.get(key)
        for r in doc["requests"]
        if r.get("ok") and all(r.get(k) == v for k, v in match.items())
    )


def _row(
    scenario: str,
    metric: str,
    a: float | None,
    b: float | None,
    *,
    unit: str,
    lower_is_better: bool,
    ci: tuple[float, float] | None = None,
) -> dict[str, Any]:
    delta = (b - a) if a is not None and b is not None else None
    significant = None if ci is None else (ci[0] > 0 or ci[1] < 0)
    verdict = None
    if delta is not None and ci is not None:
        if not significant:
            verdict = "no significant change"
        else:
            verdict = "better" if (delta < 0) == lower_is_better else "worse"
    return {
        "scenario": scenario,
        "metric": metric,
        "unit": unit,
        "a": a,
        "b": b,
        "delta": delta,
        "deltaPct": (100.0 * delta / a) if delta is not None and a else None,
        "ci": list(ci) if ci is not None else None,
        "significant": significant,
        "lowerIsBetter": lower_is_better,
        "verdict": verdict,
    }


def _quantile_row(
    scenario: str, metric: str, a: list[float], b: list[float], q: float, seed: int
) -> dict[str, Any]:
    from hpkv.bench.stats import bootstrap_ci

    ci = bootstrap_ci([a, b], q, lambda s: s[1] - s[0], seed=seed) if a and b else None
    return _row(
        scenario,
        metric,
        percentile(a, q) if a else None,
        percentile(b, q) if b else None,
        unit="ms",
        lower_is_better=True,
        ci=ci,
    )


def _cross_pod(a: dict[str, Any], b: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    from hpkv.bench.stats import bootstrap_ci

    rows = []
    by_a = {r["length"]: r for r in a["summary"].get("byLength", [])}
    by_b = {r["length"]: r for r in b["summary"].get("byLength", [])}
    for length in sorted(set(by_a) & set(by_b)):
        name = f"cross-pod {length}"
        warm_a, warm_b = (
            _samples(a, role="warm", length=length),
            _samples(b, role="warm", length=length),
        )
        cold_a, cold_b = (
            _samples(a, role="cold", length=length),
            _samples(b, role="cold", length=length),
        )
        rows.append(_quantile_row(name, "warm TTFT p50", warm_a, warm_b, 50, seed))
        rows.append(_quantile_row(name, "cold TTFT p50", cold_a, cold_b, 50, seed))
        speedup_ci = None
        if warm_a and warm_b and cold_a and cold_b:
            speedup_ci = bootstrap_ci(
                [cold_a, warm_a, cold_b, warm_b],
                50,
                lambda s: s[2] / s[3] - s[0] / s[1],
                seed=seed,
            )
        rows.append(
            _row(
                name,
                "speedup (cold/warm p50)",
                by_a[length].get("speedup"),
                by_b[length].get("speedup"),
                unit="x",
                lower_is_better=False,
                ci=speedup_ci,
            )
        )
        rows.append(
            _row(
                name,
                "hit rate",
                by_a[length].get("hitRate"),
                by_b[length].get("hitRate"),
                unit="ratio",
                lower_is_better=False,
            )
        )
        l2_a = _field(a, "l2ReadMs", role="warm", length=length)
        l2_b = _field(b, "l2ReadMs", role="warm", length=length)
        if l2_a or l2_b:
            rows.append(_quantile_row(name, "L2 read p50", l2_a, l2_b, 50, seed))
    return rows


def _load(a: dict[str, Any], b: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    name = a["name"]
    ttft_a, ttft_b = _samples(a), _samples(b)
    rows = [_quantile_row(name, f"TTFT p{q}", ttft_a, ttft_b, q, seed) for q in (50, 90, 99)]
    sa, sb = a["summary"], b["summary"]
    rows.append(
        _row(
            name,
            "throughput",
            sa.get("requestThroughput"),
            sb.get("requestThroughput"),
            unit="req/s",
            lower_is_better=False,
        )
    )
    rows.append(
        _row(
            name,
            "errors",
            sa.get("errors"),
            sb.get("errors"),
            unit="requests",
            lower_is_better=True,
        )
    )
    if name == "multi-turn":
        turns_a = {t["turn"] for t in sa.get("byTurn", [])}
        turns_b = {t["turn"] for t in sb.get("byTurn", [])}
        for turn in sorted(turns_a & turns_b):
            rows.append(
                _quantile_row(
                    name,
                    f"turn {turn} TTFT p50",
                    _samples(a, turn=turn),
                    _samples(b, turn=turn),
                    50,
                    seed,
                )
            )
    return rows


def _tier_rows(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    ta, tb = (a["summary"].get("tiers") or {}), (b["summary"].get("tiers") or {})
    if not ta and not tb:
        return []
    rows = []
    for tier, label in (("l0", "L0 hit rate"), ("external", "L1+L2 hit rate")):
        rows.append(
            _row(
                a["name"],
                label,
                (ta.get(tier) or {}).get("hitRate"),
                (tb.get(tier) or {}).get("hitRate"),
                unit="ratio",
                lower_is_better=False,
            )
        )
    return rows


def compare(a: dict[str, Any], b: dict[str, Any], *, seed: int = 0) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name in SCENARIOS:
        sa, sb = results.scenario(a, name), results.scenario(b, name)
        if sa is None or sb is None:
            continue
        rows += _cross_pod(sa, sb, seed) if name == "cross-pod" else _load(sa, sb, seed)
        rows += _tier_rows(sa, sb)
    names_a = {s["name"] for s in a.get("scenarios", [])}
    names_b = {s["name"] for s in b.get("scenarios", [])}
    env_a, env_b = a.get("environment", {}), b.get("environment", {})
    changes = [
        {"key": key, "a": env_a.get(key), "b": env_b.get(key)}
        for key in ENV_KEYS
        if env_a.get(key) != env_b.get(key)
    ]
    remote_a = (env_a.get("kvCache") or {}).get("remoteUrl")
    remote_b = (env_b.get("kvCache") or {}).get("remoteUrl")
    if remote_a != remote_b:
        changes.append({"key": "kvCache.remoteUrl", "a": remote_a, "b": remote_b})
    return {
        "a": {"runId": a.get("runId"), "createdAt": a.get("createdAt")},
        "b": {"runId": b.get("runId"), "createdAt": b.get("createdAt")},
        "confidence": CI_LEVEL,
        "rows": rows,
        "environmentChanges": changes,
        "onlyInA": sorted(names_a - names_b),
        "onlyInB": sorted(names_b - names_a),
    }
