"""``hpkv plan``'s report: every figure a number, fit checks, the cost table."""

from __future__ import annotations

from typing import Any

import pytest

from hpkv.errors import UsageError
from hpkv.sizing.catalog import Catalog
from hpkv.sizing.costmodel import Traffic
from hpkv.sizing.plan import Choice, load, report, traffic

IDENTIFIERS = {"key", "name", "gpu", "instanceType"}


def assert_numbers(node: Any, path: str = "") -> None:
    """Every leaf is a number (bool only for 'fits', None only for an absent break-even)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in IDENTIFIERS and isinstance(value, str):
                continue
            if key == "fits":
                assert isinstance(value, bool), path + key
                continue
            assert_numbers(value, f"{path}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            assert_numbers(value, f"{path}{i}.")
    else:
        assert isinstance(node, (int, float)) and not isinstance(node, bool), (path, node)


def test_report_is_all_numbers_with_the_sanity_figures() -> None:
    catalog, cost = load({}, Choice(replicas=2), memory_percent_default=20)
    result = report(catalog, cost, Traffic())
    assert_numbers(result)
    assert result["kvBytesPerToken"] == 57_344
    assert result["kvBytesPerChunk"] == 57_344 * 256
    row = next(r for r in result["load"] if r["tokens"] == 1925)
    assert row["bytes"] == 110_387_200
    assert row["l2TransferMs"] == pytest.approx(55.75, rel=0.01)
    assert result["tiers"]["l0"]["tokensTotal"] == 2 * result["tiers"]["l0"]["tokensPerReplica"]
    assert result["nodes"] == 2
    assert isinstance(result["breakEvenTokens"], int)


def test_plan_choices_come_from_flags_then_the_sizing_section() -> None:
    section = {"model": "llama-3.1-8b", "instanceType": "ml.g5.12xlarge", "replicas": 3, "tp": 2}
    _catalog, cost = load(section, Choice(), memory_percent_default=30)
    assert (cost.model.key, cost.instance.name, cost.replicas, cost.tp) == (
        "llama-3.1-8b", "ml.g5.12xlarge", 3, 2,
    )  # fmt: skip
    assert cost.memory_percent == 30
    _catalog, cost = load(section, Choice(model="qwen2-7b", tp=1, memory_percent=50),
                          memory_percent_default=30)  # fmt: skip
    assert (cost.model.key, cost.tp, cost.memory_percent) == ("qwen2-7b", 1, 50)


def test_a_model_that_does_not_fit_says_what_would() -> None:
    with pytest.raises(UsageError, match="leaves no room for KV cache") as info:
        load({}, Choice(model="llama-3.1-70b", instance_type="ml.p4d.24xlarge", tp=2),
             memory_percent_default=20)  # fmt: skip
    assert info.value.fix == "use --tp 4, or a larger instance type"
    with pytest.raises(UsageError) as info:
        load({}, Choice(model="llama-3.1-70b", instance_type="ml.g6e.4xlarge"),
             memory_percent_default=20)  # fmt: skip
    assert "instance type with more GPU memory, e.g. ml.g6e.12xlarge" in (info.value.fix or "")


def test_memory_percent_is_checked_like_tiered_storage() -> None:
    with pytest.raises(UsageError, match="--memory-percent 10 is outside"):
        load({}, Choice(memory_percent=10), memory_percent_default=20)


def test_cost_table_is_cheapest_first_and_marks_what_does_not_fit() -> None:
    catalog, cost = load({}, Choice(model="llama-3.1-70b", instance_type="ml.p5.48xlarge", tp=4),
                         memory_percent_default=20)  # fmt: skip
    rows = report(catalog, cost, Traffic(prompt_tokens=12000, output_tokens=200))["cost"]
    fitting = [r for r in rows if r["fits"]]
    assert {r["instanceType"] for r in rows} == set(Catalog().instance_types)
    prices = [r["costPerMillionRequests"] for r in fitting]
    assert prices == sorted(prices)
    assert not any(r["instanceType"] == "ml.g5.xlarge" for r in fitting)
    assert rows.index(fitting[-1]) < min(i for i, r in enumerate(rows) if not r["fits"])
    p5 = next(r for r in fitting if r["instanceType"] == "ml.p5.48xlarge")
    assert p5["tp"] in (2, 4, 8) and p5["replicasPerNode"] == 8 // p5["tp"]


def test_traffic_profile_from_section_and_flags() -> None:
    profile = traffic(
        {"traffic": {"promptTokens": 9000, "cachedFraction": 0.8}}, {"outputTokens": 64}
    )
    assert (profile.prompt_tokens, profile.output_tokens, profile.cached_fraction) == (
        9000,
        64,
        0.8,
    )
    with pytest.raises(UsageError, match="cached-fraction"):
        traffic({}, {"cachedFraction": 1.5})
    with pytest.raises(UsageError, match="requests/s"):
        traffic({}, {"requestsPerSecond": 0})


def test_tokens_beyond_the_context_are_dropped_or_refused() -> None:
    catalog, cost = load({}, Choice(), memory_percent_default=20)
    result = report(catalog, cost, Traffic(), [1000, 99999])
    assert [r["tokens"] for r in result["load"]] == [1000]
    with pytest.raises(UsageError, match=r"within 1\.\.32768"):
        report(catalog, cost, Traffic(), [99999])
