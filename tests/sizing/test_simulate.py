"""The cluster model: analytic cases, eviction order, routing, TTFT, and the segment compression
checked against the block-by-block form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpkv.sizing.catalog import Catalog
from hpkv.sizing.costmodel import CostModel
from hpkv.sizing.runner import SimulateOptions, simulate
from hpkv.sizing.simulate import Cluster, ClusterSpec, Timing, run
from hpkv.sizing.workload import SyntheticWorkload, TraceWorkload, refine, workload_spec

UNBOUNDED = 10**12
TIMING = Timing(
    overhead=10, per_token=0.01, per_token_pair=1e-6, floor=5, l1_per_token=0.001,
    l2_per_token=0.004, l2_latency=20,
)  # fmt: skip


def spec(replicas: int = 1, l0: int = UNBOUNDED, l1: int = UNBOUNDED, l2: int = UNBOUNDED, **kw):
    return ClusterSpec(replicas=replicas, l0_blocks=l0, l1_chunks=l1, l2_chunks=l2, **kw)


def trace(tmp_path: Path, rows: list[dict]) -> TraceWorkload:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return TraceWorkload(path, rate=1.0, seed=0)


def simulate_one(strategy: str, cluster: ClusterSpec, requests) -> Cluster:
    sim = Cluster(strategy, cluster, TIMING)
    run(requests, [sim])
    return sim


# --- analytic cases -----------------------------------------------------------------------------
def test_one_replica_unbounded_hits_every_reused_prefix() -> None:
    """Single-turn requests on one of K system prompts: every request after a prompt's first
    use hits exactly that prompt (its length is a multiple of the block and chunk sizes)."""
    workload = workload_spec(
        "system-prompt", {"requests": 3000, "prefixes": 40, "prefix_tokens": 1024, "skew": 1.0,
                          "question_tokens": 200, "answer_tokens": 50},
    )  # fmt: skip
    requests = list(SyntheticWorkload(workload, seed=5))
    seen: set[int] = set()
    reused = 0
    for _t, _s, path, _p, _o in requests:
        reused += path[0][0] in seen
        seen.add(path[0][0])
    sim = simulate_one("roundrobin", spec(), requests)
    total = len(requests) * (1024 + 200)
    result = sim.result()
    assert result["tokens"]["l0"] == reused * 1024
    assert result["hitRate"]["total"] == round(reused * 1024 / total, 4)
    assert result["tokens"]["l1"] == result["tokens"]["l2"] == 0  # L0 already holds it all
    assert result["recomputedTokens"] == total - reused * 1024


def test_one_replica_unbounded_multi_turn_reuses_each_previous_turn() -> None:
    workload = workload_spec(
        "chat", {"requests": 2000, "users": 30, "turns": 5, "prefixes": 3, "prefix_tokens": 512,
                 "context_tokens": 200, "question_tokens": 60, "answer_tokens": 100},
    )  # fmt: skip
    requests = list(SyntheticWorkload(workload, seed=11))
    known: dict[int, int] = {}  # session -> tokens of it the cache holds (prompt + answer)
    seen_prefix: set[int] = set()
    expected = 0
    for _t, session, path, prompt, _o in requests:
        first_turn = 512 if path[0][0] in seen_prefix else 0
        cached = known.get(session, first_turn)
        expected += min(cached // 16 * 16, (prompt - 1) // 16 * 16)
        known[session] = prompt + 100
        seen_prefix.add(path[0][0])
    sim = simulate_one("session", spec(), requests)
    assert sim.tokens_l0 == expected
    assert sim.tokens_l1 == sim.tokens_l2 == 0


@pytest.mark.parametrize("replicas", [2, 3, 5])
def test_round_robin_without_l2_hits_only_on_the_same_replica(replicas: int) -> None:
    """Round robin sends request i to replica i mod K; without L2 a request hits its prompt
    only if that replica served the same prompt before."""
    workload = workload_spec(
        "system-prompt", {"requests": 2000, "prefixes": 12, "prefix_tokens": 768, "skew": 0.5,
                          "question_tokens": 100, "answer_tokens": 0},
    )  # fmt: skip
    requests = list(SyntheticWorkload(workload, seed=2))
    seen: set[tuple[int, int]] = set()
    hits = 0
    for i, (_t, _s, path, _p, _o) in enumerate(requests):
        key = (i % replicas, path[0][0])
        hits += key in seen
        seen.add(key)
    no_l2 = simulate_one("roundrobin", spec(replicas, l2=0), requests)
    assert no_l2.routed == [len(requests) // replicas + (r < len(requests) % replicas)
                            for r in range(replicas)]  # fmt: skip
    assert no_l2.tokens_l0 + no_l2.tokens_l1 == hits * 768
    assert no_l2.tokens_l2 == 0
    # with a shared L2, the first use of a prompt on another replica reads it from L2 instead
    shared = simulate_one("roundrobin", spec(replicas), requests)
    first_uses = len({p[0][0] for _t, _s, p, _p, _o in requests})
    assert shared.tokens_l0 + shared.tokens_l1 == hits * 768
    assert shared.tokens_l2 == (len(requests) - hits - first_uses) * 768


# --- eviction -----------------------------------------------------------------------------------
def test_lru_l0_evicts_the_least_recent_prompt(tmp_path: Path) -> None:
    # 160-token prompts (10 blocks) + a 16-token question (1 block); L0 holds 21 blocks.
    # A, B: misses, L0 = A B (A's question evicted). A: hit. B: hit. C: miss, evicts A (the
    # least recently used). A: miss.
    rows = [{"segments": [[p, 160], [f"q{i}", 16]]} for i, p in enumerate("ABABCA")]
    sim = simulate_one("roundrobin", spec(l0=21, l1=0, l2=0), trace(tmp_path, rows))
    assert sim.tokens_l0 == 2 * 160
    assert sim.recomputed == 6 * 176 - 2 * 160


def test_tail_first_eviction_keeps_a_prompts_leading_blocks(tmp_path: Path) -> None:
    # L0 of 12 blocks: after a 160+32-token prompt (12 blocks), a 64-token prompt (4 blocks)
    # evicts the first prompt's 4 tail blocks, so it still hits its first 8 blocks.
    rows = [
        {"segments": [["A", 160], ["q1", 32]]},
        {"segments": [["B", 64]]},
        {"segments": [["A", 160], ["q2", 32]]},
    ]
    sim = simulate_one("roundrobin", spec(l0=12, l1=0, l2=0), trace(tmp_path, rows))
    assert sim.tokens_l0 == 8 * 16


def test_l1_and_l2_serve_whole_chunks_beyond_l0(tmp_path: Path) -> None:
    rows = [
        {"segments": [["doc", 1000], ["q1", 30]]},
        {"segments": [["other", 900]]},  # more than L0 holds: pushes doc out of L0, not L1
        {"segments": [["doc", 1000], ["q2", 30]]},
    ]
    sim = simulate_one("roundrobin", spec(l0=50, l1=100, l2=0), trace(tmp_path, rows))
    assert sim.tokens_l0 == 0
    assert sim.tokens_l1 == 768  # the 3 whole chunks of the 1,000-token document
    assert sim.recomputed == 1030 + 900 + (1030 - 768)
    # the same from L2 on a third replica, which never saw the document
    sim = simulate_one("roundrobin", spec(3, l0=50, l1=0), trace(tmp_path, rows))
    assert (sim.tokens_l0, sim.tokens_l1, sim.tokens_l2) == (0, 0, 768)


def test_l2_ttl_counts_from_the_write(tmp_path: Path) -> None:
    rows = [
        {"time": 0, "segments": [["doc", 512], ["q1", 10]]},
        {"time": 50, "segments": [["doc", 512], ["q2", 10]]},
        {"time": 200, "segments": [["doc", 512], ["q3", 10]]},
    ]
    kept = simulate_one("roundrobin", spec(3, l1=0), trace(tmp_path, rows))
    assert kept.tokens_l2 == 2 * 512
    expiring = simulate_one("roundrobin", spec(3, l1=0, l2_ttl_s=100), trace(tmp_path, rows))
    assert expiring.tokens_l2 == 512  # the third request finds it expired
    assert expiring.l2_chunks_written == 4  # written at t=0 and again at t=200


def test_caches_stay_within_capacity() -> None:
    workload = workload_spec("chat", {"requests": 3000, "users": 100})
    sim = simulate_one(
        "prefixaware", spec(4, l0=500, l1=40, l2=300, prefix_trie_segments=64),
        SyntheticWorkload(workload, seed=1),
    )  # fmt: skip
    assert all(sum(c.values()) <= 500 for c in sim.l0)
    assert all(sum(c.values()) <= 40 for c in sim.l1)
    assert sum(sim.l2.values()) <= 300
    assert len(sim._trie) <= 64
    assert sim.l0_used == [sum(c.values()) for c in sim.l0]
    assert sim.l1_used == [sum(c.values()) for c in sim.l1]
    assert sim.l2_used == sum(sim.l2.values())


# --- segments vs blocks ------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["roundrobin", "session", "prefixaware", "kvaware"])
@pytest.mark.parametrize(
    "capacities", [(UNBOUNDED, UNBOUNDED, UNBOUNDED), (2000, 60, 0), (300, 400, 0)]
)
def test_segments_behave_exactly_like_blocks(strategy: str, capacities: tuple) -> None:
    """Whole segments in the caches give the same hits, per tier, as block-by-block caching."""
    workload = workload_spec(
        "chat", {"requests": 1500, "users": 40, "turns": 5, "prefixes": 3, "prefix_tokens": 700,
                 "context_tokens": 300, "question_tokens": 50, "answer_tokens": 90},
    )  # fmt: skip
    requests = list(SyntheticWorkload(workload, seed=3))
    cluster = spec(3, *capacities)
    coarse = simulate_one(strategy, cluster, requests)
    fine = simulate_one(strategy, cluster, [refine(r, 16, 256) for r in requests])
    assert coarse.result()["tokens"] == fine.result()["tokens"]
    assert coarse.routed == fine.routed
    assert coarse.histogram == fine.histogram


def test_segments_match_blocks_closely_with_l2_and_ttl() -> None:
    """With L2 reads, a segment read in part is copied to L1 whole: small per-tier shifts."""
    workload = workload_spec(
        "chat", {"requests": 1500, "users": 40, "turns": 5, "prefixes": 3, "prefix_tokens": 700,
                 "context_tokens": 300, "question_tokens": 50, "answer_tokens": 90},
    )  # fmt: skip
    requests = list(SyntheticWorkload(workload, seed=3))
    cluster = spec(3, 300, 100, 300, l2_ttl_s=200)
    coarse = simulate_one("roundrobin", cluster, requests)
    fine = simulate_one("roundrobin", cluster, [refine(r, 16, 256) for r in requests])
    assert coarse.tokens_l0 == fine.tokens_l0
    assert coarse.recomputed == pytest.approx(fine.recomputed, rel=0.005)
    assert coarse.tokens_l1 + coarse.tokens_l2 == pytest.approx(
        fine.tokens_l1 + fine.tokens_l2, rel=0.005
    )


# --- routing ------------------------------------------------------------------------------------
def test_session_routing_is_sticky_and_prefixaware_follows_the_prefix() -> None:
    workload = workload_spec("chat", {"requests": 2000, "users": 50, "prefixes": 2})
    requests = list(SyntheticWorkload(workload, seed=4))
    for strategy in ("session", "prefixaware"):
        sim = Cluster(strategy, spec(4), TIMING)
        where: dict[int, set[int]] = {}
        for request in requests:
            replica = sim.route(request[1], request[2], request[3])
            where.setdefault(request[1], set()).add(replica)
            sim.step(*request)  # routes again: both calls must agree for a sticky router
        assert all(len(replicas) == 1 for replicas in where.values()), strategy
    # prefixaware sends every session of a system prompt where that prompt went first
    sim = simulate_one("prefixaware", spec(4), requests)
    assert sum(1 for n in sim.routed if n) <= 2


def test_kvaware_prefers_the_replica_holding_the_longest_prefix(tmp_path: Path) -> None:
    rows = [
        {"session": "a", "segments": [["doc", 4096], ["q1", 20]]},
        {"session": "b", "segments": [["doc", 4096], ["q2", 20]]},
        {"session": "c", "segments": [["doc", 300], ["short", 20]]},
    ]
    sim = simulate_one("kvaware", spec(4, l2=0), trace(tmp_path, rows))
    # the first request goes by session; the second matches all 16 chunks of the document
    # there; the third matches 1 chunk of a 320-token prompt, within the 2,000-token
    # threshold, so it follows the match as well
    assert sorted(sim.routed) == [0, 0, 0, 3]
    assert sim.tokens_l0 == 4096 + 288  # the document, then its first 18 blocks


def test_kvaware_falls_back_to_session_when_the_match_is_short(tmp_path: Path) -> None:
    rows = [
        {"session": "a", "segments": [["sys", 512], ["q", 20]]},
        {"session": "b", "segments": [["sys", 512], ["long", 5000]]},
    ]
    cluster = spec(8, l2=0)
    sim = Cluster("kvaware", cluster, TIMING)
    requests = list(trace(tmp_path, rows))
    sim.step(*requests[0])
    # 512 matched < 5,532 - 2,000: route by session like the session router would
    session_router = Cluster("session", cluster, TIMING)
    assert sim.route("b", requests[1][2], requests[1][3]) == session_router.route(
        "b", requests[1][2], requests[1][3]
    )


# --- TTFT ---------------------------------------------------------------------------------------
def test_ttft_uses_the_cost_model_and_queues_per_replica(tmp_path: Path) -> None:
    catalog = Catalog()
    cost = CostModel(catalog.model("qwen2-7b"), catalog.instance_type("ml.g6e.4xlarge"))
    timing = Timing.from_cost(cost)
    rows = [
        {"time": 0.0, "segments": [["p", 3000]]},
        {"time": 0.0, "segments": [["p2", 3000]]},
    ]
    sim = Cluster("roundrobin", spec(1), timing)
    run(trace(tmp_path, rows), [sim])
    first = cost.ttft_ms(3000)
    service = first - cost.params.overhead_ms
    assert sim.ttft_max == pytest.approx(first + service)  # waited for the first prefill
    assert sim.ttft_sum == pytest.approx(2 * first + service)
    assert sim.percentile(0.5) == pytest.approx(first, rel=0.02)


def test_a_warm_request_costs_what_the_cost_model_says(tmp_path: Path) -> None:
    catalog = Catalog()
    cost = CostModel(catalog.model("qwen2-7b"), catalog.instance_type("ml.g6e.4xlarge"))
    rows = [
        {"time": 0.0, "segments": [["doc", 8000], ["q1", 40]]},
        {"time": 60.0, "segments": [["doc", 8000], ["q2", 40]]},
    ]
    sim = Cluster("roundrobin", spec(2, l1=0), Timing.from_cost(cost))
    run(trace(tmp_path, rows), [sim])
    warm = cost.ttft_ms(8040, l2=7936)
    assert sim.tokens_l2 == 7936  # 31 whole chunks
    assert sim.ttft_sum == pytest.approx(cost.ttft_ms(8040) + warm)


# --- runner -------------------------------------------------------------------------------------
def test_results_are_deterministic_for_a_seed() -> None:
    catalog = Catalog()
    cost = CostModel(catalog.model("qwen2-7b"), catalog.instance_type("ml.g6e.4xlarge"), replicas=3)
    opts = SimulateOptions(spec_overrides={"requests": 3000}, seed=9)
    first = simulate(cost, opts).to_dict()
    assert first == simulate(cost, opts).to_dict()
    other = simulate(cost, SimulateOptions(spec_overrides={"requests": 3000}, seed=10)).to_dict()
    assert other["strategies"] != first["strategies"]
    assert [row["strategy"] for row in first["strategies"]] == [
        "roundrobin", "session", "prefixaware", "kvaware",
    ]  # fmt: skip
    for row in first["strategies"]:
        assert row["requests"] == 3000
        assert sum(row["replicaRequests"]) == 3000
        tokens = row["tokens"]
        assert (
            row["promptTokens"] == tokens["l0"] + tokens["l1"] + tokens["l2"] + tokens["recomputed"]
        )
        ttft = row["ttftMs"]
        assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"] <= ttft["max"]
