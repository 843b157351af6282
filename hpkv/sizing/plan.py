"""``hpkv plan``: size the three tiers for a model on an instance type, find where loading KV from
the shared L2 beats recomputing it, and price a traffic profile across instance types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpkv.errors import UsageError
from hpkv.sizing.catalog import GIB, Catalog
from hpkv.sizing.costmodel import (
    PUBLISHED_READ,
    CostModel,
    CostParams,
    Traffic,
    traffic_from_config,
    valid_tp_sizes,
)

DEFAULT_TOKENS = (500, 1000, 1925, 2500, 4000, 8000, 16000, 32000)


@dataclass(frozen=True)
class Choice:
    """What the user picked (flags over hpkv.yaml ``sizing``), unresolved."""

    model: str | None = None
    instance_type: str | None = None
    replicas: int | None = None
    tp: int | None = None
    memory_percent: int | None = None


def load(
    section: Mapping[str, Any],
    choice: Choice,
    *,
    memory_percent_default: int,
    config_dir: Path | None = None,
) -> tuple[Catalog, CostModel]:
    """The catalog and the cost model for the chosen setup; raises UsageError when the model
    does not fit."""
    from hpkv.sizing import CONFIG_DEFAULTS
    from hpkv.stages.tiered_storage import validate_percent

    section = {**CONFIG_DEFAULTS, **section}
    catalog = Catalog.from_config(section, base_dir=config_dir)
    model = catalog.model(choice.model or section["model"])
    instance = catalog.instance_type(choice.instance_type or section["instanceType"])
    percent = validate_percent(
        choice.memory_percent if choice.memory_percent is not None else memory_percent_default
    )
    params = CostParams.from_config(section.get("costModel") or {})
    if params.chunk_tokens % params.block_tokens:
        raise UsageError(
            f"sizing.costModel.chunkTokens {params.chunk_tokens} is not a multiple of "
            f"blockTokens {params.block_tokens}",
            fix="use LMCache's chunk size (256) and vLLM's block size (16)",
        )
    cost = CostModel(
        model,
        instance,
        tp=choice.tp or int(section["tp"]),
        replicas=choice.replicas or int(section["replicas"]),
        memory_percent=percent,
        params=params,
    )
    if not cost.fits:
        raise UsageError(
            f"{model.key} ({_gib(model.weight_bytes)} GiB of weights) leaves no room for KV cache "
            f"on {instance.name} with --tp {cost.tp} ({cost.tp} x {instance.gpu.memory_gib:g} GiB "
            f"{instance.gpu.name} at {params.gpu_memory_utilization:g} utilization)",
            fix=_fit_hint(catalog, cost),
        )
    return catalog, cost


def _fit_hint(catalog: Catalog, cost: CostModel) -> str:
    for tp in valid_tp_sizes(cost.model, cost.instance):
        if tp > cost.tp and cost.with_tp(tp).fits:
            return f"use --tp {tp}, or a larger instance type"
    fitting = [
        (t.price_per_hour, t.name)
        for t in catalog.instance_types.values()
        if _smallest_fitting_tp(cost, t.name, catalog, 1) is not None
    ]
    if fitting:
        return f"use an instance type with more GPU memory, e.g. {min(fitting)[1]}"
    return "no catalog instance type holds this model; add one under sizing.instanceTypes"


def _smallest_fitting_tp(cost: CostModel, name: str, catalog: Catalog, tokens: int) -> int | None:
    instance = catalog.instance_types[name]
    for tp in valid_tp_sizes(cost.model, instance):
        candidate = replace(cost, instance=instance, tp=tp)
        if candidate.fits and candidate.l0_tokens_per_replica >= tokens:
            return tp
    return None


def _gib(n: float) -> float:
    return round(n / GIB, 2)


def report(
    catalog: Catalog, cost: CostModel, traffic: Traffic, tokens: Sequence[int] = DEFAULT_TOKENS
) -> dict[str, Any]:
    """Every figure of ``hpkv plan`` (numbers only, JSON-ready)."""
    model, instance = cost.model, cost.instance
    lengths = sorted({t for t in tokens if 0 < t <= model.max_context})
    if not lengths:
        raise UsageError(
            f"no --tokens value is within 1..{model.max_context} (the model's context)",
            fix="pass prompt lengths such as --tokens 2000",
        )
    return {
        "model": model.to_dict(),
        "instanceType": instance.to_dict(),
        "replicas": cost.replicas,
        "tp": cost.tp,
        "memoryPercent": cost.memory_percent,
        "replicasPerNode": cost.replicas_per_node,
        "nodes": cost.nodes,
        "kvBytesPerToken": cost.kv_bytes_per_token,
        "kvBytesPerChunk": cost.chunk_bytes,
        "weightsGiB": _gib(model.weight_bytes),
        "tiers": {
            "l0": {
                "bytesPerReplica": int(cost.l0_bytes_per_replica),
                "tokensPerReplica": cost.l0_tokens_per_replica,
                "tokensTotal": cost.l0_tokens_per_replica * cost.replicas,
            },
            "l1": {
                "bytesPerNode": int(cost.l1_bytes_per_node),
                "tokensPerReplica": cost.l1_tokens_per_replica,
                "tokensTotal": cost.l1_tokens_per_replica * cost.replicas,
            },
            "l2": {
                "bytes": int(cost.l2_bytes),
                "tokens": cost.l2_tokens,
                "chunks": cost.l2_tokens // cost.params.chunk_tokens,
            },
        },
        "rates": {
            "l2ReadGBps": round(cost.l2_read_gbytes, 3),
            "l2LatencyMs": cost.params.l2_latency_ms,
            "l1ReadGBps": cost.params.l1_read_gbps,
            "prefillTflops": round(cost.effective_flops / 1e12, 1),
        },
        "load": [cost.load_row(n) for n in lengths],
        "breakEvenTokens": cost.break_even_tokens(),
        "traffic": traffic.to_dict(),
        "cost": cost_table(catalog, cost, traffic),
    }


def cost_table(catalog: Catalog, cost: CostModel, traffic: Traffic) -> list[dict[str, Any]]:
    """The traffic profile priced on every catalog instance type, cheapest first, each at the
    tensor-parallel size that serves it cheapest (among those that hold the model and one
    sequence of the profile)."""
    rows, misfits = [], []
    needed = traffic.prompt_tokens + traffic.output_tokens
    for name, instance in catalog.instance_types.items():
        options = []
        for tp in valid_tp_sizes(cost.model, instance):
            candidate = replace(cost, instance=instance, tp=tp)
            if candidate.fits and candidate.l0_tokens_per_replica >= needed:
                options.append(candidate.cost_row(traffic))
        if options:
            rows.append(min(options, key=lambda r: (r["costPerMillionRequests"], r["tp"])))
        else:
            misfits.append({"instanceType": name, "fits": False})
    rows.sort(key=lambda r: (r["costPerMillionRequests"], r["instanceType"]))
    return rows + misfits


def traffic(section: Mapping[str, Any], overrides: Mapping[str, Any]) -> Traffic:
    values = dict(section.get("traffic") or {})
    values.update({k: v for k, v in overrides.items() if v is not None})
    result = traffic_from_config(values)
    if result.requests_per_second <= 0 or result.prompt_tokens < 2 or result.output_tokens < 1:
        raise UsageError(
            "the traffic profile needs requests/s > 0, prompt tokens >= 2, output tokens >= 1",
            fix="check --rps, --prompt-tokens and --output-tokens",
        )
    if not 0 <= result.cached_fraction <= 1:
        raise UsageError("--cached-fraction must be between 0 and 1", fix="pass e.g. 0.5")
    return result


def published_read_check(catalog: Catalog, params: CostParams) -> dict[str, float]:
    """The published cross-node read as this cost model predicts it (for the README/tests)."""
    cost = CostModel(
        catalog.model("qwen2-7b"), catalog.instance_type(PUBLISHED_READ["instanceType"]),
        params=params,
    )  # fmt: skip
    tokens = int(PUBLISHED_READ["tokens"])
    return {
        "tokens": tokens,
        "bytes": tokens * cost.kv_bytes_per_token,
        "gib": round(tokens * cost.kv_bytes_per_token / GIB, 4),
        "predictedMs": round(cost.l2_transfer_ms(tokens), 2),
        "publishedMs": PUBLISHED_READ["ms"],
        "predictedGiBps": round(cost.l2_read_gbytes * 1e9 / GIB, 2),
        "publishedGiBps": PUBLISHED_READ["gibps"],
    }
