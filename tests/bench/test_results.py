"""The result document: summaries from raw requests, the JSON schema, loading, report and charts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hpkv.bench import SCHEMA_VERSION, charts, report, results
from hpkv.errors import UsageError


def _request(role: str, ttft: float, **extra: Any) -> dict[str, Any]:
    record = {
        "ok": True,
        "role": role,
        "client": 0,
        "target": "pod-b" if role != "seed" else "pod-a",
        "startS": extra.pop("startS", 0.0),
        "ttftMs": ttft,
        "e2eMs": ttft + 20.0,
        "outputTokens": 5,
        "id": f"cmpl-{role}-{ttft}",
    }
    record.update(extra)
    return record


def cross_pod_doc() -> dict[str, Any]:
    requests = []
    for rep, (cold, warm) in enumerate([(200.0, 40.0), (220.0, 60.0), (210.0, 50.0)]):
        common = {"length": 1000, "rep": rep, "promptTokens": 1000}
        requests += [
            _request("seed", cold, l2WriteBytes=57344000.0, **common),
            _request(
                "warm",
                warm,
                hitTokens=999.0,
                l0HitTokens=0.0,
                l2ReadBytes=57344000.0,
                l2ReadMs=20.0 + rep,
                **common,
            ),
            _request("cold", cold + 1, hitTokens=0.0, **common),
        ]
    requests.append(
        {
            **_request("cold", 0.0, length=1000, rep=3),
            "ok": False,
            "ttftMs": None,
            "error": "HTTP 503: overloaded",
        }
    )
    doc = {
        "name": "cross-pod",
        "driver": "hpkv",
        "clients": 1,
        "startedAt": "2026-11-29T10:00:00Z",
        "finishedAt": "2026-11-29T10:01:00Z",
        "durationS": 60.0,
        "parameters": {
            "lengths": [1000],
            "repetitions": 3,
            "podA": "pod-a",
            "podB": "pod-b",
            "maxTokens": 5,
        },
        "requests": requests,
        "metrics": None,
        "summary": {},
        "notes": [],
    }
    doc["summary"] = results.summarize(doc)
    return doc


def load_doc() -> dict[str, Any]:
    requests = [
        _request(
            "load",
            100.0 + i,
            startS=i * 0.5,
            promptTokens=1100,
            outputTokens=32,
            prefix=i % 2,
            user=i,
            request=i,
        )
        for i in range(10)
    ]
    tiers = {
        "l0": {"hits": 500.0, "queries": 1000.0, "hitRate": 0.5},
        "external": {"hits": 250.0, "queries": 1000.0, "hitRate": 0.25},
        "l2": {"readBytes": 1e6, "readRequests": 2.0, "writeBytes": 2e6, "writeRequests": 3.0},
        "retrieve": {"count": 2.0, "meanMs": 12.5},
        "promptTokens": 1000.0,
    }
    doc = {
        "name": "shared-prefix",
        "driver": "hpkv",
        "clients": 2,
        "startedAt": None,
        "finishedAt": None,
        "durationS": 5.0,
        "parameters": {
            "prefixes": 2,
            "prefixTokens": 1000,
            "users": 10,
            "suffixTokens": 100,
            "requests": 10,
            "concurrency": 2,
            "via": "router",
        },
        "requests": requests,
        "metrics": {"source": "pod-proxy", "pods": {}, "tiers": tiers},
        "summary": {},
        "notes": [],
    }
    doc["summary"] = results.summarize(doc)
    return doc


def full_result() -> dict[str, Any]:
    result = results.new_result(
        "20261129-100000-abcd",
        {
            "endpoint": "default/demo",
            "scenarios": ["cross-pod", "shared-prefix"],
            "location": "in-cluster",
            "clients": 2,
            "api": "completions",
            "seed": 1,
        },
        {
            "model": "Qwen/Qwen2-7B-Instruct",
            "replicas": 2,
            "instanceType": "ml.g6e.4xlarge",
            "image": "lmcache/vllm-openai:v0.3.7",
        },
    )
    result["scenarios"] = [cross_pod_doc(), load_doc()]
    return result


def test_cross_pod_summary_per_length() -> None:
    (row,) = cross_pod_doc()["summary"]["byLength"]
    assert row["coldTtftMs"]["p50"] == 211.0 and row["warmTtftMs"]["p50"] == 50.0
    assert (row["warmTtftMs"]["min"], row["warmTtftMs"]["max"]) == (40.0, 60.0)
    assert row["speedup"] == 211.0 / 50.0
    assert row["ttftSavedMs"] == 161.0
    assert row["hitTokens"] == 999.0 and row["hitRate"] == 2997 / 3000
    assert row["l2ReadMs"]["p50"] == 21.0
    assert row["kvBytesPerToken"] == 57344000.0 / 999.0
    assert row["l2WriteBytes"] == 57344000.0
    assert row["published"]["speedup"] == 1.7
    assert row["repetitions"] == 3  # the failed request is counted as an error, not a sample
    assert cross_pod_doc()["summary"]["errors"] == 1


def test_load_summary_throughput_and_percentiles() -> None:
    summary = load_doc()["summary"]
    assert summary["ok"] == 10 and summary["errors"] == 0
    # first start 0.0 s, last end 4.5 s + 129 ms
    assert summary["durationS"] == pytest.approx(4.5 + 0.129)
    assert summary["requestThroughput"] == pytest.approx(10 / 4.629)
    assert summary["ttftMs"]["p50"] == 104.5 and summary["ttftMs"]["p90"] == pytest.approx(108.1)
    assert summary["tpotMs"]["p50"] == pytest.approx(20.0 / 31)
    assert summary["tiers"]["external"]["hitRate"] == 0.25


def test_result_validates_against_its_schema_and_round_trips(tmp_path: Path) -> None:
    result = full_result()
    assert results.validation_errors(result) == []
    path = results.save(result, tmp_path / "r" / "result.json")
    assert results.load(path) == json.loads(json.dumps(result))
    assert results.schema()["properties"]["schemaVersion"]["pattern"] == "^1\\.[0-9]+$"
    assert SCHEMA_VERSION.startswith("1.")

    broken = copy.deepcopy(result)
    del broken["scenarios"][0]["requests"][0]["ttftMs"]
    broken["scenarios"][1]["requests"][0]["role"] = "warmup"
    errors = results.validation_errors(broken)
    assert any("scenarios/0/requests/0" in e and "ttftMs" in e for e in errors)
    assert any("scenarios/1/requests/0/role" in e for e in errors)
    with pytest.raises(ValueError, match="does not match its schema"):
        results.save(broken, tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "is not JSON"),
        ('{"kind": "Other"}', "is not an hpkv bench result"),
        (
            '{"kind": "HpkvBenchResult", "schemaVersion": "2.0"}',
            "has result schema version 2.0; this hpkv reads 1.x",
        ),
        ('{"kind": "HpkvBenchResult", "schemaVersion": "1.3"}', "is not a valid bench result"),
    ],
)
def test_load_rejects_what_is_not_a_readable_result(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError, match=message) as error:
        results.load(path)
    assert error.value.fix


def test_a_newer_minor_version_with_extra_fields_is_read(tmp_path: Path) -> None:
    result = full_result()
    result["schemaVersion"] = "1.7"
    result["scenarios"][0]["requests"][0]["gpuUtilisation"] = 0.9
    result["environment"]["futureField"] = {"x": 1}
    path = tmp_path / "future.json"
    path.write_text(json.dumps(result))
    assert results.load(path)["schemaVersion"] == "1.7"


def test_report_has_every_section_and_the_published_comparison() -> None:
    result = full_result()
    text = report.render(result, {"ttft-by-length": Path("ttft-by-length.png")})
    assert text.startswith("# hpkv bench 20261129-100000-abcd")
    assert "client ran inside the cluster on 2 pods" in text
    assert "| instance type | ml.g6e.4xlarge |" in text
    assert (
        "| 1000 | 211 (201–221) | 50.0 (40.0–60.0) | 4.22× | 1.70× | 999 | 99.9% | 21.0 (20.0–22.0) | 54.7 MiB |"
        in text
    )
    assert "![TTFT cold vs warm](ttft-by-length.png)" in text
    assert "| shared-prefix | 50.0% | 25.0% | 1.0 MiB | 1.9 MiB | 12.5 |" in text
    assert "## Shared-prefix load" in text and "2 client(s)" in text
    assert "HTTP 503: overloaded" not in text.split("## Cross-pod")[0]


def test_charts_are_pngs_and_only_for_what_was_measured(tmp_path: Path) -> None:
    files = charts.render_all(full_result(), tmp_path)
    assert sorted(files) == ["tier-hit-rates", "ttft-by-length", "ttft-cdf"]
    for path in files.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    only_load = full_result()
    only_load["scenarios"] = [load_doc()]
    (tmp_path / "load").mkdir()
    assert sorted(charts.render_all(only_load, tmp_path / "load")) == ["tier-hit-rates", "ttft-cdf"]
