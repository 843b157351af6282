"""Worker metrics and LMCache log lines on the hpkv side."""

from __future__ import annotations

from hpkv.bench.metrics import (
    MetricsScraper,
    attach_log_figures,
    parse_lmcache_log,
    scenario_metrics,
)
from tests.harness.fake_vllm import FakeCluster

LOG = """\
[2026-11-29 10:00:00,001] LMCache INFO: Reqid: cmpl-aaa-0, Total tokens 1925, Inference Engine computed tokens: 0, LMCache hit tokens: 1925, need to load: 1924 (vllm_v1_adapter.py:1202:lmcache.integration.vllm.vllm_v1_adapter)
[2026-11-29 10:00:00,058] LMCache INFO: [req_id=cmpl-aaa-0] Retrieved 1925 out of 1924 required tokens (from 1925 total tokens). size: 0.1028 gb, cost 55.7500 ms, throughput: 1.8441 GB/s; (cache_engine.py:655:lmcache.v1.cache_engine)
INFO 11-29 10:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 192.5 tokens/s
[2026-11-29 10:00:02,000] LMCache INFO: Reqid: cmpl-bbb-0-1f2e3d4c, Total tokens 500, LMCache hit tokens: 256, need to load: 256
[2026-11-29 10:00:02,010] LMCache INFO: [req_id=cmpl-bbb-0-1f2e3d4c] Retrieved 256 out of 256 out of total 500 tokens
[2026-11-29 10:00:03,000] LMCache INFO: [req_id=cmpl-ccc-0] Stored 500 out of total 500 tokens. size: 0.0267 GB, cost 3.2000 ms, throughput: 8.3 GB/s; offload_time: 1.0 ms, put_time: 2.2 ms
"""


def test_lmcache_lines_of_current_and_older_versions() -> None:
    entries = parse_lmcache_log(LOG)
    assert entries["cmpl-aaa-0"] == {
        "lmcacheHitTokens": 1925,
        "needToLoad": 1924,
        "retrievedTokens": 1925,
        "retrieveMs": 55.75,
        "retrieveBytes": 0.1028 * 1024**3,
    }
    assert entries["cmpl-bbb-0-1f2e3d4c"] == {
        "lmcacheHitTokens": 256,
        "needToLoad": 256,
        "retrievedTokens": 256,
    }
    assert "cmpl-ccc-0" not in entries  # a store is not a read


def test_log_figures_fill_only_what_metrics_left_out() -> None:
    records = [
        {
            "id": "cmpl-aaa",
            "role": "warm",
            "l2ReadMs": None,
            "hitTokens": 1924.0,
            "l2ReadBytes": None,
        },
        {"id": "cmpl-bbb", "role": "warm", "l2ReadMs": 9.0, "lmcacheHitTokens": None},
        {"id": "cmpl-zzz", "role": "warm"},
        {"id": None, "role": "warm"},
    ]
    assert attach_log_figures(records, parse_lmcache_log(LOG)) == 2
    assert records[0]["l2ReadMs"] == 55.75 and records[0]["l2ReadSource"] == "log"
    assert records[0]["l2ReadBytes"] == 0.1028 * 1024**3 and records[0]["hitTokens"] == 1924.0
    assert records[1]["l2ReadMs"] == 9.0 and "l2ReadSource" not in records[1]
    assert records[1]["lmcacheHitTokens"] == 256
    assert records[2] == {"id": "cmpl-zzz", "role": "warm"}


def test_scenario_metrics_sum_pods_and_tolerate_a_missing_one() -> None:
    before = {
        "a": {"l0Hits": 10.0, "l0Queries": 100.0},
        "b": {"l0Hits": 0.0, "l0Queries": 0.0},
        "c": None,
    }
    after = {
        "a": {"l0Hits": 60.0, "l0Queries": 200.0},
        "b": {"l0Hits": 30.0, "l0Queries": 100.0},
        "c": {"l0Hits": 5.0},
    }
    out = scenario_metrics(before, after, "direct")
    assert out["pods"]["c"] is None
    assert out["pods"]["a"]["tiers"]["l0"]["hitRate"] == 0.5
    assert out["tiers"]["l0"] == {"hits": 80.0, "queries": 200.0, "hitRate": 0.4}
    assert out["tiers"]["external"]["hitRate"] is None  # not exported: unknown, not zero


def test_direct_scraper_reads_the_fake_pods_and_records_failures() -> None:
    with FakeCluster(pods=1) as cluster:
        scraper = MetricsScraper.direct({"p0": cluster.pod(0).url, "dead": "http://127.0.0.1:9"})
        snaps = scraper.snapshot(["p0", "dead"])
    assert snaps["dead"] is None and scraper.errors == {"dead": "/metrics not available"}
    assert snaps["p0"]["l0Queries"] == 0.0 and "l2ReadBytes" in snaps["p0"]
