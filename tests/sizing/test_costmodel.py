"""The cost model: capacities, load vs recompute, the published sanity figures and calibration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpkv.errors import UsageError
from hpkv.sizing.catalog import GIB, Catalog
from hpkv.sizing.costmodel import (
    PUBLISHED_SWEEP,
    PUBLISHED_SWEEP_SETUP,
    CostModel,
    CostParams,
    Traffic,
    published_sweep_comparison,
)
from hpkv.sizing.plan import published_read_check

CATALOG = Catalog()


def cost_model(model: str = "qwen2-7b", instance: str = "ml.g6e.4xlarge", **kw) -> CostModel:
    return CostModel(CATALOG.model(model), CATALOG.instance_type(instance), **kw)


def test_published_cross_node_read_is_reproduced() -> None:
    # AWS/Curvine blog: "Retrieved 1925 tokens ... cost 55.75 ms, 1.84 GB/s" (LMCache GB = GiB)
    check = published_read_check(CATALOG, CostParams())
    assert check["bytes"] == 1925 * 57_344 == 110_387_200  # ~110 MB
    assert check["gib"] == pytest.approx(0.1028, abs=1e-4)
    assert check["predictedMs"] == pytest.approx(55.75, rel=0.01)
    assert check["predictedGiBps"] == pytest.approx(1.84, abs=0.01)


def test_l2_bandwidth_is_the_slower_of_nvme_and_network() -> None:
    cost = cost_model()  # g6e.4xlarge: network 20 Gbit/s = 2.5 GB/s, NVMe 3 GB/s
    assert cost.l2_read_gbytes == pytest.approx(2.5 * cost.params.l2_read_efficiency)
    slow_disk = replace(cost.instance, nvme_read_gbps=1.0)
    assert replace(cost, instance=slow_disk).l2_read_gbytes == pytest.approx(
        1.0 * cost.params.l2_read_efficiency
    )
    assert cost.l2_load_ms(0) == 0
    assert cost.l2_load_ms(1925) == pytest.approx(
        cost.params.l2_latency_ms + 1925 * 57_344 / (cost.l2_read_gbytes * 1e9) * 1000
    )


def test_calibrated_speedups_are_near_the_published_sweep() -> None:
    cost = cost_model(PUBLISHED_SWEEP_SETUP["model"], PUBLISHED_SWEEP_SETUP["instanceType"])
    rows = {r["promptTokens"]: r for r in published_sweep_comparison(cost)}
    assert len(rows) == len(PUBLISHED_SWEEP)
    for row in rows.values():
        assert row["predictedSpeedup"] == pytest.approx(row["publishedSpeedup"], abs=0.55), row
    # break-even near 500 tokens, a clear win at 1,000 and ~2.5x at 2,500 ...
    assert 0.9 <= rows[500]["predictedSpeedup"] <= 1.2
    assert rows[1000]["predictedSpeedup"] >= 1.4
    assert rows[2500]["predictedSpeedup"] >= 2.3
    # ... with the 2,500-token latencies themselves (774 ms -> 287 ms) within 10%
    assert rows[2500]["predictedColdMs"] == pytest.approx(774, rel=0.1)
    assert rows[2500]["predictedWarmMs"] == pytest.approx(287, rel=0.1)


def test_l0_capacity_is_gpu_memory_times_utilisation_minus_weights_and_reserve() -> None:
    cost = cost_model()
    params, model = cost.params, cost.model
    expected = 44.99 * GIB * params.gpu_memory_utilization - model.params * 2 - 1.5 * GIB
    assert cost.l0_bytes_per_replica == pytest.approx(expected)
    blocks = int(expected // (57_344 * 16))
    assert cost.l0_tokens_per_replica == blocks * 16
    # L1: 20% of 128 GiB in whole 256-token chunks, one replica per node
    assert cost.l1_tokens_per_replica == int(128 * GIB * 0.2 // (57_344 * 256)) * 256
    # L2: every node's NVMe (600 GB) times the usable fraction, two nodes for two replicas
    two = cost_model(replicas=2)
    assert two.nodes == 2
    assert two.l2_bytes == pytest.approx(2 * 600e9 * params.l2_usable_fraction)
    assert replace(two, params=replace(params, l2_capacity_gib=100)).l2_bytes == 100 * GIB


def test_replicas_share_a_nodes_l1_and_tp_splits_the_gpus() -> None:
    cost = cost_model("llama-3.1-70b", "ml.p5.48xlarge", tp=4, replicas=3)
    assert (cost.replicas_per_node, cost.nodes) == (2, 2)
    assert cost.l1_tokens_per_replica == int(2048 * GIB * 0.2 / 2 // (327_680 * 256)) * 256
    assert cost.fits
    assert not cost_model("llama-3.1-70b", "ml.g6e.4xlarge").fits


def test_invalid_tp_and_replicas_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="--tp 2 is not possible") as info:
        cost_model(tp=2)  # one GPU
    assert info.value.fix == "use one of: 1"
    with pytest.raises(UsageError, match="--tp 8 is not possible"):
        cost_model("qwen2-7b", "ml.p5.48xlarge", tp=8)  # 28 attention heads
    with pytest.raises(UsageError, match="--replicas"):
        cost_model(replicas=0)


def test_prefill_flops_count_weights_and_causal_attention() -> None:
    cost = cost_model()
    model = cost.model
    width = model.attention_heads * model.head_dim
    assert cost.prefill_flops(0, 1000) == 2 * model.matmul_params * 1000 + 2 * 28 * width * 1000**2
    assert cost.prefill_flops(400, 1000) == (
        2 * model.matmul_params * 600 + 2 * 28 * width * (1000**2 - 400**2)
    )
    # a pass never beats reading the weights once
    assert cost.prefill_ms(999, 1000) == pytest.approx(cost.weight_pass_ms)


def test_break_even_is_where_l2_first_wins() -> None:
    cost = cost_model()
    even = cost.break_even_tokens()
    assert even is not None
    assert cost.warm_ttft_ms(even) < cost.cold_ttft_ms(even)
    assert cost.warm_ttft_ms(even - cost.params.block_tokens) >= cost.cold_ttft_ms(
        even - cost.params.block_tokens
    )
    # a GPU that much slower than the L2 read makes L2 pay off sooner
    assert cost_model("qwen2-7b", "ml.g5.4xlarge").break_even_tokens() < even
    # an L2 slower than recomputing never pays off
    slow = replace(cost, params=replace(cost.params, l2_read_efficiency=0.01))
    assert slow.break_even_tokens() is None


def test_lmcache_serves_whole_chunks_and_never_the_last_token() -> None:
    cost = cost_model()
    assert cost.lmcache_hit(255) == 0
    assert cost.lmcache_hit(600) == 512
    assert cost.lmcache_hit(512) == 511


def test_cost_rows_price_the_profile() -> None:
    traffic = Traffic(requests_per_second=20, prompt_tokens=8000, output_tokens=128)
    cost = cost_model("qwen2-7b", "ml.g5.4xlarge")
    row = cost.cost_row(traffic)
    assert row["fits"] is True
    assert row["costPerMillionRequests"] < row["costPerMillionRequestsNoCache"]
    per_replica = row["requestsPerSecondPerReplica"]
    assert row["replicasNeeded"] - 1 < 20 / per_replica <= row["replicasNeeded"] + 1e-3
    assert row["costPerHour"] == pytest.approx(row["nodesNeeded"] * 2.03)
    expected = 2.03 / (per_replica * 3600) * 1e6
    assert row["costPerMillionRequests"] == pytest.approx(expected, rel=0.01)
    assert all(isinstance(v, (int, float)) for k, v in row.items() if k != "instanceType")
