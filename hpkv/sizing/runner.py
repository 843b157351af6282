"""One ``hpkv simulate`` run: options from flags and hpkv.yaml, the workload stream, one
:class:`~hpkv.sizing.simulate.Cluster` per strategy fed in a single pass, and the result."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpkv.errors import UsageError
from hpkv.output.reporter import NullReporter, Reporter
from hpkv.sizing import STRATEGIES
from hpkv.sizing.costmodel import CostModel
from hpkv.sizing.simulate import Cluster, ClusterSpec, Timing, run
from hpkv.sizing.workload import (
    SPEC_FIELDS,
    Request,
    SyntheticWorkload,
    TraceWorkload,
    WorkloadSpec,
    workload_spec,
)

DEFAULT_CHART = "hpkv-simulate.png"


@dataclass(frozen=True)
class SimulateOptions:
    workload: str = "chat"
    trace: Path | None = None
    spec_overrides: Mapping[str, Any] = field(default_factory=dict)  # WorkloadSpec field names
    strategies: tuple[str, ...] = STRATEGIES
    seed: int = 0
    l2_ttl_s: float = 0.0
    kvaware_threshold: int = 2000


def options(section: Mapping[str, Any], flags: Mapping[str, Any]) -> SimulateOptions:
    """hpkv.yaml ``sizing.simulate`` with the command's flags (None = not given) on top."""
    merged = {**section, **{k: v for k, v in flags.items() if v is not None}}
    overrides = {SPEC_FIELDS[k]: v for k, v in merged.items() if k in SPEC_FIELDS}
    strategies = tuple(merged.get("strategies") or STRATEGIES)
    for name in strategies:
        if name not in STRATEGIES:
            raise UsageError(
                f"unknown routing strategy '{name}'", fix=f"use one of {', '.join(STRATEGIES)}"
            )
    trace = flags.get("trace")
    if trace is not None and flags.get("workload") is not None:
        raise UsageError("--workload and --trace exclude each other", fix="pass one of them")
    return SimulateOptions(
        workload=str(merged.get("workload") or "chat"),
        trace=Path(trace).expanduser() if trace else None,
        spec_overrides=overrides,
        strategies=tuple(dict.fromkeys(strategies)),
        seed=int(merged.get("seed") or 0),
        l2_ttl_s=float(merged.get("l2TtlSeconds") or 0.0),
        kvaware_threshold=int(merged.get("kvawareThreshold", 2000)),
    )


@dataclass
class Simulation:
    cost: CostModel
    options: SimulateOptions
    spec: WorkloadSpec | None
    cluster: ClusterSpec
    clusters: list[Cluster]
    requests: int
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        cost = self.cost
        strategies = [cluster.result(cost.chunk_bytes) for cluster in self.clusters]
        workload: dict[str, Any]
        if self.spec is not None:
            workload = self.spec.to_dict()
        else:
            workload = {"kind": "trace", "file": str(self.options.trace)}
        return {
            "model": cost.model.key,
            "instanceType": cost.instance.name,
            "replicas": cost.replicas,
            "tp": cost.tp,
            "memoryPercent": cost.memory_percent,
            "seed": self.options.seed,
            "workload": workload,
            "cluster": self.cluster.to_dict(),
            "requests": self.requests,
            "simulatedSeconds": round(self.clusters[0].duration_s, 3),
            "strategies": strategies,
            "best": _best(strategies),
        }


def _best(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The strategy that does best on each figure; ties go to the lower mean TTFT."""
    if not rows:
        return {}

    def mean(row: Mapping[str, Any]) -> float:
        return row["ttftMs"]["mean"]

    return {
        "hitRate": max(rows, key=lambda r: (r["hitRate"]["total"], -mean(r)))["strategy"],
        "ttftP50": min(rows, key=lambda r: (r["ttftMs"]["p50"], mean(r)))["strategy"],
        "ttftP99": min(rows, key=lambda r: (r["ttftMs"]["p99"], mean(r)))["strategy"],
    }


def cluster_spec(cost: CostModel, opts: SimulateOptions) -> ClusterSpec:
    p = cost.params
    return ClusterSpec(
        replicas=cost.replicas,
        l0_blocks=cost.l0_tokens_per_replica // p.block_tokens,
        l1_chunks=cost.l1_tokens_per_replica // p.chunk_tokens,
        l2_chunks=cost.l2_tokens // p.chunk_tokens,
        l2_ttl_s=opts.l2_ttl_s,
        block_tokens=p.block_tokens,
        chunk_tokens=p.chunk_tokens,
        kvaware_threshold=opts.kvaware_threshold,
        seed=opts.seed,
    )


def workload(
    cost: CostModel, opts: SimulateOptions
) -> tuple[Iterable[Request], WorkloadSpec | None]:
    p = cost.params
    if opts.trace is not None:
        rate = float(opts.spec_overrides.get("rate") or WorkloadSpec.rate)
        trace = TraceWorkload(
            opts.trace, rate=rate, seed=opts.seed, block=p.block_tokens, chunk=p.chunk_tokens
        )
        return trace, None
    spec = workload_spec(opts.workload, opts.spec_overrides)
    limit = cost.model.max_context
    longest = (
        spec.prefix_tokens
        + spec.context_tokens
        + spec.turns * spec.question_tokens
        + (spec.turns - 1) * spec.answer_tokens
    )
    if longest > limit:
        raise UsageError(
            f"the workload's longest prompt ({longest} tokens) exceeds {cost.model.key}'s context "
            f"({limit} tokens)",
            fix="lower --prefix-tokens, --context-tokens, --turns or the turn lengths",
        )
    generator = SyntheticWorkload(spec, seed=opts.seed, block=p.block_tokens, chunk=p.chunk_tokens)
    return generator, spec


def simulate(
    cost: CostModel, opts: SimulateOptions, *, reporter: Reporter | None = None
) -> Simulation:
    reporter = reporter or NullReporter()
    stream, spec = workload(cost, opts)
    spec_cluster = cluster_spec(cost, opts)
    timing = Timing.from_cost(cost)
    clusters = [Cluster(name, spec_cluster, timing) for name in opts.strategies]
    total = spec.requests if spec is not None else None
    what = f"{total:,} requests" if total else f"the trace {opts.trace}"
    started = time.perf_counter()
    with reporter.progress(f"simulating {what} x {len(clusters)} strategies", total) as bar:
        count = run(stream, clusters, progress=bar.advance)
    wall = time.perf_counter() - started
    if count == 0:
        raise UsageError(f"the trace {opts.trace} has no requests", fix="pass a non-empty trace")
    reporter.debug(f"simulated {count:,} requests in {wall:.2f} s")
    return Simulation(cost, opts, spec, spec_cluster, clusters, count, wall)
