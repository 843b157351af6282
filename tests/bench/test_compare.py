"""`bench compare`: deltas with bootstrap confidence intervals, and the statistics under them."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from hpkv.bench import compare, results, stats
from tests.bench.test_results import full_result


def _with_warm_ttft(result: dict[str, Any], values: list[float]) -> dict[str, Any]:
    cross = results.scenario(result, "cross-pod")
    assert cross is not None
    cross["requests"] = [r for r in cross["requests"] if r["role"] != "warm"]
    for i, value in enumerate(values):
        cross["requests"].append(
            {
                "ok": True,
                "role": "warm",
                "client": 0,
                "target": "b",
                "startS": float(i),
                "ttftMs": value,
                "e2eMs": value + 10,
                "length": 1000,
                "promptTokens": 1000,
                "hitTokens": 999.0,
            }
        )
    cross["summary"] = results.summarize(cross)
    return result


def test_a_real_improvement_has_an_interval_below_zero() -> None:
    rng = random.Random(1)
    a = _with_warm_ttft(full_result(), [rng.gauss(100, 5) for _ in range(40)])
    b = _with_warm_ttft(full_result(), [rng.gauss(80, 5) for _ in range(40)])
    out = compare.compare(a, b)
    rows = {(r["scenario"], r["metric"]): r for r in out["rows"]}
    warm = rows[("cross-pod 1000", "warm TTFT p50")]
    assert warm["delta"] == pytest.approx(warm["b"] - warm["a"])
    assert -25 < warm["delta"] < -15
    assert warm["ci"][0] < warm["delta"] < warm["ci"][1] < 0
    assert (warm["significant"], warm["verdict"]) == (True, "better")
    speedup = rows[("cross-pod 1000", "speedup (cold/warm p50)")]
    assert speedup["ci"][0] > 0 and speedup["verdict"] == "better"
    assert out["confidence"] == 0.95
    assert compare.compare(a, b)["rows"] == out["rows"]  # deterministic for the seed


def test_the_same_distribution_shows_no_significant_change() -> None:
    rng = random.Random(2)
    samples = [rng.gauss(100, 10) for _ in range(60)]
    out = compare.compare(
        _with_warm_ttft(full_result(), samples),
        _with_warm_ttft(full_result(), list(reversed(samples))),
    )
    warm = next(r for r in out["rows"] if r["metric"] == "warm TTFT p50")
    assert warm["delta"] == 0 and warm["ci"][0] <= 0 <= warm["ci"][1]
    assert warm["verdict"] == "no significant change"
    tiers = [
        r
        for r in out["rows"]
        if r["metric"].endswith("hit rate") and r["scenario"] == "shared-prefix"
    ]
    assert [r["ci"] for r in tiers] == [None, None]


def test_environment_changes_and_scenarios_in_one_run_only() -> None:
    a, b = full_result(), full_result()
    b["environment"]["image"] = "lmcache/vllm-openai:v0.3.9"
    b["environment"]["kvCache"] = {"remoteUrl": "fs://localhost:0/mnt/curvine/l2cache/"}
    b["scenarios"] = [s for s in b["scenarios"] if s["name"] == "cross-pod"]
    out = compare.compare(a, b)
    assert {
        "key": "image",
        "a": "lmcache/vllm-openai:v0.3.7",
        "b": "lmcache/vllm-openai:v0.3.9",
    } in out["environmentChanges"]
    assert {
        "key": "kvCache.remoteUrl",
        "a": None,
        "b": "fs://localhost:0/mnt/curvine/l2cache/",
    } in out["environmentChanges"]
    assert out["onlyInA"] == ["shared-prefix"] and out["onlyInB"] == []
    assert {r["scenario"] for r in out["rows"]} == {"cross-pod 1000"}


def test_percentiles_match_numpy_linear_interpolation() -> None:
    rng = random.Random(3)
    values = [rng.expovariate(0.01) for _ in range(257)]
    for q in (0, 1, 50, 90, 99, 99.9, 100):
        assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert stats.distribution([]) is None
    assert stats.distribution([5, None, "x", True])["n"] == 1


def test_bootstrap_covers_the_true_difference_most_of_the_time() -> None:
    rng = random.Random(4)
    covered = 0
    for trial in range(40):
        a = [rng.gauss(50, 8) for _ in range(30)]
        b = [rng.gauss(45, 8) for _ in range(30)]
        low, high = stats.bootstrap_ci([a, b], 50, lambda s: s[1] - s[0], seed=trial, resamples=500)
        covered += low <= -5 <= high
    assert covered >= 33  # nominal 95%; a small-sample median interval is a little narrow
