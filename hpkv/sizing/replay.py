"""``hpkv simulate --replay RESULT.json``: a measured bench result against the cost model.

The bench result's schema belongs to ``hpkv bench`` (hpkv/bench). This module reads only the
fields below, through :data:`BENCH_FIELDS` and friends, which list the accepted paths for each
figure (dotted paths into the JSON; the first one present wins). Align them here, in one place,
if the bench schema changes. Times are milliseconds.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpkv.errors import UsageError
from hpkv.sizing.catalog import Catalog
from hpkv.sizing.costmodel import CostModel

# Top level: the setup the bench measured.
BENCH_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("model", "config.model", "setup.model"),
    "instanceType": ("instanceType", "config.instanceType", "setup.instanceType"),
    "replicas": ("replicas", "config.replicas", "setup.replicas"),
    "tp": ("tp", "config.tp", "setup.tp", "config.tensorParallelSize"),
    "requests": ("requests", "results.requests"),  # list: one item per request
    "sweep": ("sweep", "results.sweep"),  # list: one item per prompt length
}
# Each item of "requests".
REQUEST_FIELDS: dict[str, tuple[str, ...]] = {
    "promptTokens": ("promptTokens", "prompt_tokens"),
    "ttftMs": ("ttftMs", "ttft_ms"),
    "hitTokens": ("hitTokens", "hit_tokens", "cachedTokens"),  # tokens served from the cache
}
# Each item of "sweep": the same prompt cold (first pod) and warm (read from L2 by another pod).
SWEEP_FIELDS: dict[str, tuple[str, ...]] = {
    "promptTokens": ("promptTokens", "prompt_tokens"),
    "coldTtftMs": ("coldTtftMs", "cold.ttftMs"),
    "warmTtftMs": ("warmTtftMs", "warm.ttftMs"),
    "hitTokens": ("hitTokens", "warm.hitTokens"),
}


@dataclass(frozen=True)
class BenchResult:
    model: str
    instance_type: str
    replicas: int
    tp: int
    requests: tuple[tuple[int, float, int], ...]  # (prompt tokens, TTFT ms, hit tokens)
    sweep: tuple[tuple[int, float, float, int | None], ...]  # (prompt, cold, warm, hit)


def _lookup(document: Mapping[str, Any], paths: Sequence[str]) -> Any:
    for path in paths:
        node: Any = document
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return node
    return None


def read_bench_result(path: Path) -> BenchResult:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"bench result {path} does not exist", fix="pass the JSON file 'hpkv bench' wrote"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"cannot read {path} as JSON: {exc}", fix="pass the JSON file 'hpkv bench' wrote"
        ) from None
    if not isinstance(document, dict):
        raise UsageError(f"{path} is not a JSON object", fix="pass a bench result file")
    return bench_result(document, where=str(path))


BENCH_RESULT_KIND = "HpkvBenchResult"  # hpkv/bench/schema/bench-result-v1.schema.json


def flatten_bench_v1(document: Mapping[str, Any]) -> dict[str, Any]:
    """The flat view BENCH_FIELDS reads, from an ``hpkv bench`` result (schema 1.x).

    Per-request figures come from every scenario's raw requests; the cold/warm sweep comes from
    the cross-pod scenario's per-length summary (medians). The bench does not record the tensor
    parallel size, so it is taken as 1 unless the environment names it.
    """
    env = document.get("environment") or {}
    requests: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    for scenario in document.get("scenarios") or []:
        for request in scenario.get("requests") or []:
            if (
                request.get("ok")
                and request.get("ttftMs") is not None
                and request.get("promptTokens")
            ):
                requests.append(
                    {
                        "promptTokens": request["promptTokens"],
                        "ttftMs": request["ttftMs"],
                        "hitTokens": request.get("hitTokens") or request.get("cachedTokens") or 0,
                    }
                )
        if scenario.get("name") == "cross-pod":
            for row in (scenario.get("summary") or {}).get("byLength") or []:
                cold, warm = row.get("coldTtftMs") or {}, row.get("warmTtftMs") or {}
                if (
                    row.get("promptTokens")
                    and cold.get("p50") is not None
                    and warm.get("p50") is not None
                ):
                    hit = row.get("hitTokens")
                    sweep.append(
                        {  # summaries hold medians: whole token counts as floats
                            "promptTokens": round(row["promptTokens"]),
                            "coldTtftMs": cold["p50"],
                            "warmTtftMs": warm["p50"],
                            "hitTokens": round(hit) if hit is not None else None,
                        }
                    )
    return {
        "model": env.get("model") or env.get("modelName"),
        "instanceType": env.get("instanceType"),
        "replicas": env.get("replicas"),
        "tp": env.get("tensorParallelSize") or 1,
        "requests": requests,
        "sweep": sweep,
    }


def bench_result(document: Mapping[str, Any], *, where: str = "bench result") -> BenchResult:
    """The figures replay needs, from a bench result document (see BENCH_FIELDS)."""
    if document.get("kind") == BENCH_RESULT_KIND:
        document = flatten_bench_v1(document)
    setup = {key: _lookup(document, paths) for key, paths in BENCH_FIELDS.items()}
    missing = [k for k in ("model", "instanceType") if not setup[k]]
    if missing:
        paths = "; ".join(f"{k}: {' or '.join(BENCH_FIELDS[k])}" for k in missing)
        raise UsageError(
            f"{where} lacks {', '.join(missing)}",
            fix=f"pass a result written by 'hpkv bench' (looked for {paths})",
        )
    requests = tuple(
        (
            _int(item, REQUEST_FIELDS, "promptTokens", where),
            _float(item, REQUEST_FIELDS, "ttftMs", where),
            _int(item, REQUEST_FIELDS, "hitTokens", where, default=0),
        )
        for item in _items(setup["requests"], where, "requests")
    )
    sweep = tuple(
        (
            _int(item, SWEEP_FIELDS, "promptTokens", where),
            _float(item, SWEEP_FIELDS, "coldTtftMs", where),
            _float(item, SWEEP_FIELDS, "warmTtftMs", where),
            _optional_int(item, SWEEP_FIELDS, "hitTokens", where),
        )
        for item in _items(setup["sweep"], where, "sweep")
    )
    if not requests and not sweep:
        raise UsageError(
            f"{where} has neither per-request TTFTs nor a cold/warm sweep",
            fix="run 'hpkv bench' to completion and pass its result",
        )
    return BenchResult(
        model=str(setup["model"]),
        instance_type=str(setup["instanceType"]),
        replicas=int(setup["replicas"] or 1),
        tp=int(setup["tp"] or 1),
        requests=requests,
        sweep=sweep,
    )


def _items(value: Any, where: str, name: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise UsageError(f"{where}: '{name}' is not a list of objects", fix="pass a bench result")
    return value


def _value(item: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], key: str) -> Any:
    return _lookup(item, fields[key])


def _float(item: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], key: str, where: str) -> float:  # fmt: skip
    value = _value(item, fields, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UsageError(
            f"{where}: an item lacks a positive '{key}' (got {value!r})",
            fix=f"check the result; accepted names: {', '.join(fields[key])}",
        )
    return float(value)


def _int(item: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], key: str, where: str,
         default: int | None = None) -> int:  # fmt: skip
    value = _value(item, fields, key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(
            f"{where}: an item lacks a whole-number '{key}' (got {value!r})",
            fix=f"check the result; accepted names: {', '.join(fields[key])}",
        )
    return value


def _optional_int(item: Mapping[str, Any], fields: Mapping[str, tuple[str, ...]], key: str,
                  where: str) -> int | None:  # fmt: skip
    return None if _value(item, fields, key) is None else _int(item, fields, key, where)


# --- comparison -------------------------------------------------------------------------------
def replay(bench: BenchResult, catalog: Catalog, cost: CostModel) -> dict[str, Any]:
    """Predicted vs measured for every sweep point and request, and fitted cost-model values."""
    model = catalog.model(bench.model)
    instance = catalog.instance_type(bench.instance_type)
    cost = replace(cost, model=model, instance=instance, tp=bench.tp, replicas=bench.replicas)
    sweep = [_sweep_row(cost, *point) for point in bench.sweep]
    requests = [(p, ttft, cost.ttft_ms(p, l2=min(hit, p - 1))) for p, ttft, hit in bench.requests]
    return {
        "model": model.key,
        "instanceType": instance.name,
        "replicas": bench.replicas,
        "tp": bench.tp,
        "sweep": sweep,
        "requests": _request_summary(requests),
        "fitted": _fit(cost, bench),
    }


def _sweep_row(cost: CostModel, prompt: int, cold: float, warm: float, hit: int | None) -> dict:
    cached = cost.lmcache_hit(prompt) if hit is None else min(hit, prompt - 1)
    predicted_cold = cost.cold_ttft_ms(prompt)
    predicted_warm = cost.ttft_ms(prompt, l2=cached)
    return {
        "promptTokens": prompt,
        "hitTokens": cached,
        "measuredColdMs": round(cold, 2),
        "predictedColdMs": round(predicted_cold, 2),
        "measuredWarmMs": round(warm, 2),
        "predictedWarmMs": round(predicted_warm, 2),
        "measuredSpeedup": round(cold / warm, 2),
        "predictedSpeedup": round(predicted_cold / predicted_warm, 2),
    }


def _request_summary(rows: list[tuple[int, float, float]]) -> dict[str, Any]:
    if not rows:
        return {"count": 0}
    measured = [m for _p, m, _q in rows]
    predicted = [q for _p, _m, q in rows]
    errors = [(q - m) / m for _p, m, q in rows]
    return {
        "count": len(rows),
        "measuredP50Ms": round(_quantile(measured, 0.5), 2),
        "predictedP50Ms": round(_quantile(predicted, 0.5), 2),
        "measuredP90Ms": round(_quantile(measured, 0.9), 2),
        "predictedP90Ms": round(_quantile(predicted, 0.9), 2),
        "medianAbsErrorPct": round(statistics.median(abs(e) for e in errors) * 100, 1),
        "meanErrorPct": round(statistics.fmean(errors) * 100, 1),
    }


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _fit(cost: CostModel, bench: BenchResult) -> dict[str, float]:
    """sizing.costModel values that fit the measurements: overheadMs and prefillEfficiency from
    cold TTFTs (TTFT = overhead + FLOPs / (peak x efficiency)), then l2LatencyMs and
    l2ReadEfficiency from warm ones. A value is left out when the points cannot determine it."""
    peak_ms = cost.tp * cost.instance.gpu.tflops * 1e12 / 1000
    cold = [(p, c) for p, c, _w, _h in bench.sweep]
    cold += [(p, t) for p, t, hit in bench.requests if hit == 0]
    fitted: dict[str, float] = {}
    line = _line([cost.prefill_flops(0, p) / peak_ms for p, _c in cold], [c for _p, c in cold])
    if line is None or line[1] <= 0 or line[0] < 0:
        return fitted
    overhead, slope = line
    fitted["overheadMs"] = round(overhead, 1)
    fitted["prefillEfficiency"] = round(1 / slope, 3)
    refit = replace(
        cost,
        params=replace(cost.params, overhead_ms=overhead, prefill_efficiency=1 / slope),
    )
    warm = [(p, w, cost.lmcache_hit(p) if h is None else h) for p, _c, w, h in bench.sweep]
    warm += [(p, t, h) for p, t, h in bench.requests if h > 0]
    xs, ys = [], []
    for prompt, measured, hit in warm:
        hit = min(hit, prompt - 1)
        rest = measured - overhead - refit.prefill_ms(hit, prompt)
        xs.append(hit * cost.kv_bytes_per_token / 1e6)  # MB
        ys.append(rest)
    line = _line(xs, ys)
    if line is None or line[1] <= 0:
        return fitted
    latency, ms_per_mb = line
    slower = min(cost.instance.nvme_read_gbps, cost.instance.network_gbytes)
    fitted["l2LatencyMs"] = round(max(latency, 0.0), 1)
    fitted["l2ReadEfficiency"] = round(1 / ms_per_mb / slower, 3)  # MB/ms = GB/s
    return fitted


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope); None without two distinct x values."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope
