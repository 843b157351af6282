"""Replaying a bench result: the adapter (field paths) and predicted vs measured."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpkv.errors import UsageError
from hpkv.sizing.catalog import Catalog
from hpkv.sizing.costmodel import CostModel
from hpkv.sizing.replay import BENCH_FIELDS, bench_result, read_bench_result, replay

CATALOG = Catalog()


def measured_cost() -> CostModel:
    """The 'real' cluster the fixture was measured on: other values than the defaults."""
    cost = CostModel(CATALOG.model("qwen2-7b"), CATALOG.instance_type("ml.g5.4xlarge"), replicas=2)
    return replace(
        cost,
        params=replace(
            cost.params,
            overhead_ms=55.0,
            prefill_efficiency=0.6,
            l2_latency_ms=12.0,
            l2_read_efficiency=0.5,
        ),
    )


def bench_document(cost: CostModel) -> dict[str, Any]:
    """A bench result as hpkv bench might write it (the shape BENCH_FIELDS reads)."""
    lengths = (600, 1200, 2500, 4000, 6000)
    return {
        "config": {"model": "Qwen/Qwen2-7B-Instruct", "instanceType": "ml.g5.4xlarge",
                   "replicas": 2, "tp": 1},
        "sweep": [
            {
                "promptTokens": n,
                "coldTtftMs": round(cost.cold_ttft_ms(n), 3),
                "warmTtftMs": round(cost.warm_ttft_ms(n), 3),
                "hitTokens": cost.lmcache_hit(n),
            }
            for n in lengths
        ],
        "requests": [
            {"promptTokens": n, "ttftMs": round(cost.ttft_ms(n, l2=hit), 3), "hitTokens": hit}
            for n in (800, 3000, 5000)
            for hit in (0, n // 256 * 256)
        ],
    }  # fmt: skip


@pytest.fixture
def result_file(tmp_path: Path) -> Path:
    path = tmp_path / "bench-result.json"
    path.write_text(json.dumps(bench_document(measured_cost())))
    return path


def test_the_adapter_reads_the_bench_fields(result_file: Path) -> None:
    bench = read_bench_result(result_file)
    assert (bench.model, bench.instance_type, bench.replicas, bench.tp) == (
        "Qwen/Qwen2-7B-Instruct", "ml.g5.4xlarge", 2, 1,
    )  # fmt: skip
    assert len(bench.sweep) == 5 and len(bench.requests) == 6
    assert bench.sweep[0][0] == 600 and bench.sweep[0][3] == 512
    # alternative paths for the same figures
    flat = {
        "model": "qwen2-7b",
        "instanceType": "ml.g6e.4xlarge",
        "results": {"requests": [{"prompt_tokens": 100, "ttft_ms": 50.0}]},
    }
    bench = bench_result(flat)
    assert (bench.replicas, bench.tp, bench.requests) == (1, 1, ((100, 50.0, 0),))


def test_predicted_matches_measured_when_the_model_is_right(result_file: Path) -> None:
    cost = measured_cost()
    report = replay(read_bench_result(result_file), CATALOG, cost)
    assert (report["model"], report["instanceType"]) == ("qwen2-7b", "ml.g5.4xlarge")
    for row in report["sweep"]:
        assert row["predictedColdMs"] == pytest.approx(row["measuredColdMs"], abs=0.02)
        assert row["predictedWarmMs"] == pytest.approx(row["measuredWarmMs"], abs=0.02)
        assert row["predictedSpeedup"] == pytest.approx(row["measuredSpeedup"], abs=0.01)
    assert report["requests"]["medianAbsErrorPct"] == 0.0
    assert report["requests"]["count"] == 6


def test_replay_with_default_values_shows_the_error_and_fits_the_real_ones(
    result_file: Path,
) -> None:
    default = CostModel(CATALOG.model("qwen2-7b"), CATALOG.instance_type("ml.g5.4xlarge"))
    report = replay(read_bench_result(result_file), CATALOG, default)
    assert report["requests"]["medianAbsErrorPct"] > 5
    fitted = report["fitted"]
    assert fitted["overheadMs"] == pytest.approx(55.0, rel=0.05)
    assert fitted["prefillEfficiency"] == pytest.approx(0.6, rel=0.02)
    assert fitted["l2LatencyMs"] == pytest.approx(12.0, abs=1.5)
    assert fitted["l2ReadEfficiency"] == pytest.approx(0.5, rel=0.05)


def test_missing_or_malformed_fields_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="lacks instanceType") as info:
        bench_result({"model": "qwen2-7b", "sweep": []})
    assert all(path in (info.value.fix or "") for path in BENCH_FIELDS["instanceType"])
    with pytest.raises(UsageError, match="neither per-request TTFTs nor a cold/warm sweep"):
        bench_result({"model": "qwen2-7b", "instanceType": "ml.g5.4xlarge"})
    with pytest.raises(UsageError, match="positive 'ttftMs'"):
        bench_result({"model": "m", "instanceType": "t", "requests": [{"promptTokens": 5}]})
    with pytest.raises(UsageError, match="'sweep' is not a list"):
        bench_result({"model": "m", "instanceType": "t", "sweep": {"a": 1}})
    with pytest.raises(UsageError, match="does not exist"):
        read_bench_result(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    with pytest.raises(UsageError, match="not a JSON object"):
        read_bench_result(bad)


def bench_v1_document(cost: CostModel) -> dict[str, Any]:
    """The same measurements in the real ``hpkv bench`` result format (validated below)."""
    from hpkv.bench.results import new_result, summarize_cross_pod

    inputs = {
        "scenarios": ["cross-pod"],
        "location": "in-cluster",
        "clients": 1,
        "api": "completions",
        "seed": 1,
    }
    environment = {
        "model": "Qwen/Qwen2-7B-Instruct",
        "instanceType": "ml.g5.4xlarge",
        "replicas": 2,
        "image": "vllm/vllm-openai:latest",
    }
    result = new_result("run-1", inputs=inputs, environment=environment)
    requests = []
    for n in (600, 1200, 2500):
        hit = cost.lmcache_hit(n)
        common = {
            "ok": True,
            "client": 0,
            "length": n,
            "rep": 0,
            "promptTokens": n,
            "startS": 0.0,
            "e2eMs": 900.0,
        }
        requests.append({**common, "role": "seed", "target": "a", "ttftMs": cost.cold_ttft_ms(n)})
        requests.append(
            {
                **common,
                "role": "warm",
                "target": "b",
                "ttftMs": cost.warm_ttft_ms(n),
                "hitTokens": hit,
            }
        )
        requests.append(
            {
                **common,
                "role": "cold",
                "target": "b",
                "ttftMs": cost.cold_ttft_ms(n),
                "hitTokens": 0,
            }
        )
    scenario = {
        "name": "cross-pod",
        "driver": "hpkv",
        "clients": 1,
        "startedAt": result["createdAt"],
        "finishedAt": result["createdAt"],
        "durationS": 1.0,
        "parameters": {"lengths": [600, 1200, 2500]},
        "requests": requests,
    }
    scenario["summary"] = summarize_cross_pod(scenario)
    result["scenarios"].append(scenario)
    return result  # fmt: skip


def test_replay_reads_the_real_bench_result_format(tmp_path: Path) -> None:
    from hpkv.bench.results import validation_errors

    cost = measured_cost()
    document = bench_v1_document(cost)
    assert validation_errors(document) == []
    path = tmp_path / "result.json"
    path.write_text(json.dumps(document))
    bench = read_bench_result(path)
    assert (bench.model, bench.instance_type, bench.replicas, bench.tp) == (
        "Qwen/Qwen2-7B-Instruct", "ml.g5.4xlarge", 2, 1,
    )  # fmt: skip
    assert [row[0] for row in bench.sweep] == [600, 1200, 2500]
    cold, warm = bench.sweep[1][1], bench.sweep[1][2]
    assert cold == pytest.approx(cost.cold_ttft_ms(1200)) and warm == pytest.approx(
        cost.warm_ttft_ms(1200)
    )
    assert bench.sweep[2][3] == cost.lmcache_hit(2500)
    assert len(bench.requests) == 9
