"""The cost model shared by ``hpkv plan`` and ``hpkv simulate``: tier capacities and the time to
serve a prompt from each tier or to recompute it.

TTFT = overhead + prefill of the tokens no tier holds (with attention over the cached prefix)
+ L1 read (host memory -> GPU) + L2 read (a fixed lookup latency + bytes / L2 bandwidth), where
the L2 bandwidth is the slower of the NVMe read and the network times an efficiency, and prefill
takes the longer of its FLOPs / (peak x efficiency) and one pass over the weights.

Calibration (see :data:`PUBLISHED_SWEEP` and the README): the L2 efficiency reproduces the
published cross-node read (1,925 Qwen2-7B tokens = 0.1028 GiB in 55.75 ms = 1.84 GiB/s on
ml.g6e.4xlarge, whose 20 Gbit/s network is the slower side); overhead, prefill efficiency and the
L2 lookup latency are a least-squares fit to the published TTFT sweep on ml.g5.4xlarge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from hpkv.errors import UsageError
from hpkv.sizing.catalog import GIB, InstanceType, Model, ceil_div


@dataclass(frozen=True)
class CostParams:
    """Tunable assumptions; hpkv.yaml ``sizing.costModel.<camelCase>`` overrides each."""

    gpu_memory_utilization: float = 0.9  # vLLM --gpu-memory-utilization default
    reserve_gib: float = 1.5  # per GPU, outside the KV pool: activations, CUDA graphs, NCCL
    prefill_efficiency: float = 0.81  # fitted, see module docstring
    overhead_ms: float = 40.0  # fitted: HTTP, tokenisation, scheduling, sampling
    l1_read_gbps: float = 13.0  # host memory -> GPU, GB/s (low end of 13-22 GB/s seen for LMCache)
    l2_read_efficiency: float = 0.792  # 1.98 GB/s measured / 2.5 GB/s network of ml.g6e.4xlarge
    l2_latency_ms: float = 28.0  # fitted: lookup and file opens on the L2 mount, per request
    l2_usable_fraction: float = 0.9  # share of local NVMe given to the Curvine worker
    l2_capacity_gib: float = 0.0  # 0: nodes x NVMe x l2_usable_fraction
    block_tokens: int = 16  # vLLM block size
    chunk_tokens: int = 256  # LMCache chunk size
    max_batch: int = 256  # vLLM --max-num-seqs default
    target_utilization: float = 0.8  # busy share a replica is planned for in cost figures

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> CostParams:
        names = {_camel(f.name): f.name for f in fields(cls)}
        return cls(**{names[k]: v for k, v in values.items() if k in names})


_UNITS = {"gib": "GiB", "gbps": "GBps", "ms": "Ms"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(_UNITS.get(p, p.capitalize()) for p in rest)


COST_PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        _camel(f.name): (
            {"type": "integer", "minimum": 1}
            if f.type == "int"
            else {"type": "number", "minimum": 0}
        )
        for f in fields(CostParams)
    },
}


@dataclass(frozen=True)
class Traffic:
    """The traffic profile that cost per million requests is computed for."""

    requests_per_second: float = 10.0
    prompt_tokens: int = 4000
    output_tokens: int = 256
    cached_fraction: float = 0.5  # share of prompt tokens whose KV a tier already holds

    def to_dict(self) -> dict[str, Any]:
        return {
            "requestsPerSecond": self.requests_per_second,
            "promptTokens": self.prompt_tokens,
            "outputTokens": self.output_tokens,
            "cachedFraction": self.cached_fraction,
        }


TRAFFIC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "requestsPerSecond": {"type": "number", "exclusiveMinimum": 0},
        "promptTokens": {"type": "integer", "minimum": 1},
        "outputTokens": {"type": "integer", "minimum": 1},
        "cachedFraction": {"type": "number", "minimum": 0, "maximum": 1},
    },
}


def traffic_from_config(values: Mapping[str, Any]) -> Traffic:
    return Traffic(
        requests_per_second=float(values.get("requestsPerSecond", Traffic.requests_per_second)),
        prompt_tokens=int(values.get("promptTokens", Traffic.prompt_tokens)),
        output_tokens=int(values.get("outputTokens", Traffic.output_tokens)),
        cached_fraction=float(values.get("cachedFraction", Traffic.cached_fraction)),
    )


def valid_tp_sizes(model: Model, instance: InstanceType) -> list[int]:
    """Tensor-parallel sizes vLLM accepts on one node: powers of two that divide the heads."""
    sizes, tp = [], 1
    while tp <= instance.gpus:
        if model.attention_heads % tp == 0:
            sizes.append(tp)
        tp *= 2
    return sizes


@dataclass(frozen=True)
class CostModel:
    model: Model
    instance: InstanceType
    tp: int = 1
    replicas: int = 1
    memory_percent: int = 20
    params: CostParams = CostParams()

    def __post_init__(self) -> None:
        if self.tp not in valid_tp_sizes(self.model, self.instance):
            sizes = ", ".join(map(str, valid_tp_sizes(self.model, self.instance)))
            raise UsageError(
                f"--tp {self.tp} is not possible for {self.model.key} on {self.instance.name} "
                f"({self.instance.gpus} GPU(s), {self.model.attention_heads} attention heads)",
                fix=f"use one of: {sizes}",
            )
        if self.replicas < 1:
            raise UsageError("--replicas must be at least 1", fix="pass --replicas 1 or more")

    def with_tp(self, tp: int) -> CostModel:
        return replace(self, tp=tp)

    # --- layout -------------------------------------------------------------------------------
    @property
    def replicas_per_node(self) -> int:
        return self.instance.gpus // self.tp

    @property
    def nodes(self) -> int:
        return ceil_div(self.replicas, self.replicas_per_node)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    # --- capacities ---------------------------------------------------------------------------
    @property
    def l0_bytes_per_replica(self) -> float:
        gpu = self.instance.gpu
        usable = self.tp * gpu.memory_gib * self.params.gpu_memory_utilization * GIB
        return usable - self.model.weight_bytes - self.tp * self.params.reserve_gib * GIB

    @property
    def fits(self) -> bool:
        return self.l0_bytes_per_replica >= self.kv_bytes_per_token * self.params.block_tokens

    @property
    def l0_tokens_per_replica(self) -> int:
        blocks = max(int(self.l0_bytes_per_replica // self.block_bytes), 0)
        return blocks * self.params.block_tokens

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.params.block_tokens

    @property
    def chunk_bytes(self) -> int:
        return self.kv_bytes_per_token * self.params.chunk_tokens

    @property
    def l1_bytes_per_node(self) -> float:
        return self.instance.host_memory_gib * GIB * self.memory_percent / 100

    @property
    def l1_tokens_per_replica(self) -> int:
        sharing = min(self.replicas_per_node, self.replicas)
        chunks = int(self.l1_bytes_per_node / sharing // self.chunk_bytes)
        return chunks * self.params.chunk_tokens

    @property
    def l2_bytes(self) -> float:
        if self.params.l2_capacity_gib > 0:
            return self.params.l2_capacity_gib * GIB
        return self.nodes * self.instance.nvme_gb * 1e9 * self.params.l2_usable_fraction

    @property
    def l2_tokens(self) -> int:
        return int(self.l2_bytes // self.chunk_bytes) * self.params.chunk_tokens

    # --- rates --------------------------------------------------------------------------------
    @property
    def l2_read_gbytes(self) -> float:
        """GB/s for one replica reading KV from the shared L2 on another node."""
        slower = min(self.instance.nvme_read_gbps, self.instance.network_gbytes)
        return slower * self.params.l2_read_efficiency

    @property
    def effective_flops(self) -> float:
        return self.tp * self.instance.gpu.tflops * 1e12 * self.params.prefill_efficiency

    @property
    def weight_pass_ms(self) -> float:
        """One forward pass cannot beat reading every weight once from GPU memory."""
        bandwidth = self.tp * self.instance.gpu.memory_bandwidth_gbps * 1e9
        return self.model.weight_bytes / bandwidth * 1000

    @property
    def attention_width(self) -> int:
        return self.model.attention_heads * self.model.head_dim

    def prefill_flops(self, cached: int, prompt: int) -> float:
        """FLOPs to compute tokens [cached, prompt): 2 x matmul params per token, plus causal
        attention (QK^T and AV) over every earlier position in every layer."""
        new = prompt - cached
        attention = 2 * self.model.layers * self.attention_width * (prompt**2 - cached**2)
        return 2 * self.model.matmul_params * new + attention

    def prefill_ms(self, cached: int, prompt: int) -> float:
        compute = self.prefill_flops(cached, prompt) / self.effective_flops * 1000
        return max(compute, self.weight_pass_ms)

    def l2_transfer_ms(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / (self.l2_read_gbytes * 1e9) * 1000

    def l2_load_ms(self, tokens: int) -> float:
        return self.params.l2_latency_ms + self.l2_transfer_ms(tokens) if tokens > 0 else 0.0

    def l1_load_ms(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / (self.params.l1_read_gbps * 1e9) * 1000

    def ttft_ms(self, prompt: int, l0: int = 0, l1: int = 0, l2: int = 0) -> float:
        """TTFT for a prompt whose first l0 + l1 + l2 tokens come from those tiers."""
        cached = min(l0 + l1 + l2, prompt - 1)
        return (
            self.params.overhead_ms
            + self.prefill_ms(cached, prompt)
            + self.l1_load_ms(l1)
            + self.l2_load_ms(l2)
        )

    def lmcache_hit(self, prompt: int) -> int:
        """Tokens LMCache can serve for a fully cached prompt: whole chunks only (the trailing
        partial chunk is never stored), and never the last token (vLLM recomputes it)."""
        chunk = self.params.chunk_tokens
        return min(prompt // chunk * chunk, prompt - 1)

    def cold_ttft_ms(self, prompt: int) -> float:
        return self.ttft_ms(prompt)

    def warm_ttft_ms(self, prompt: int) -> float:
        """TTFT when another replica computed this prompt before: its chunks come from L2."""
        return self.ttft_ms(prompt, l2=self.lmcache_hit(prompt))

    def decode_step_ms(self, batch: int, context: int) -> float:
        """One decode step: memory bound, weights plus the batch's KV read once."""
        bandwidth = self.tp * self.instance.gpu.memory_bandwidth_gbps * 1e9
        data = self.model.weight_bytes + batch * context * self.kv_bytes_per_token
        return data / bandwidth * 1000

    def break_even_tokens(self) -> int | None:
        """The shortest prompt (in steps of one vLLM block) whose TTFT is lower with its prefix
        in L2 than when recomputed; None when L2 never wins up to the context length."""
        step = self.params.block_tokens
        for prompt in range(self.params.chunk_tokens + 1, self.model.max_context + 1, step):
            if self.warm_ttft_ms(prompt) < self.cold_ttft_ms(prompt):
                return prompt
        return None

    def load_row(self, tokens: int) -> dict[str, float | int]:
        cached = self.lmcache_hit(tokens)
        cold, warm = self.cold_ttft_ms(tokens), self.warm_ttft_ms(tokens)
        return {
            "tokens": tokens,
            "bytes": tokens * self.kv_bytes_per_token,
            "l2TransferMs": _r(self.l2_transfer_ms(tokens)),
            "l2LoadMs": _r(self.l2_load_ms(tokens)),
            "l1LoadMs": _r(self.l1_load_ms(tokens)),
            "recomputeMs": _r(self.prefill_ms(0, tokens)),
            "cachedTokens": cached,
            "coldTtftMs": _r(cold),
            "warmTtftMs": _r(warm),
            "speedup": round(cold / warm, 2),
        }

    # --- throughput and cost ------------------------------------------------------------------
    def request_gpu_ms(self, traffic: Traffic, *, cached_fraction: float | None = None) -> float:
        """GPU time one request of the profile occupies on its replica (prefill, L2 wait and its
        share of batched decode steps)."""
        fraction = traffic.cached_fraction if cached_fraction is None else cached_fraction
        prompt, output = traffic.prompt_tokens, traffic.output_tokens
        chunk = self.params.chunk_tokens
        cached = min(int(prompt * fraction) // chunk * chunk, prompt - 1)
        prefill = self.prefill_ms(cached, prompt) + self.l2_load_ms(cached)
        batch = self.decode_batch(traffic)
        decode = output * self.decode_step_ms(batch, prompt + output // 2) / batch
        return prefill + decode

    def decode_batch(self, traffic: Traffic) -> int:
        per_sequence = traffic.prompt_tokens + traffic.output_tokens
        return max(1, min(self.params.max_batch, self.l0_tokens_per_replica // per_sequence))

    def cost_row(self, traffic: Traffic) -> dict[str, Any]:
        warm = self._capacity(traffic, None)
        cold = self._capacity(traffic, 0.0)
        return {
            "instanceType": self.instance.name,
            "fits": True,
            "tp": self.tp,
            "replicasPerNode": self.replicas_per_node,
            "pricePerHour": self.instance.price_per_hour,
            "ttftColdMs": _r(self.cold_ttft_ms(traffic.prompt_tokens)),
            "ttftCachedMs": _r(
                self.ttft_ms(traffic.prompt_tokens, l2=self._cached_tokens(traffic))
            ),
            "requestsPerSecondPerReplica": round(warm["replicaRps"], 3),
            "replicasNeeded": warm["replicas"],
            "nodesNeeded": warm["nodes"],
            "costPerHour": round(warm["costPerHour"], 2),
            "costPerMillionRequests": round(warm["costPerMillion"], 2),
            "costPerMillionRequestsNoCache": round(cold["costPerMillion"], 2),
        }

    def _cached_tokens(self, traffic: Traffic) -> int:
        chunk = self.params.chunk_tokens
        cached = int(traffic.prompt_tokens * traffic.cached_fraction) // chunk * chunk
        return min(cached, traffic.prompt_tokens - 1)

    def _capacity(self, traffic: Traffic, cached_fraction: float | None) -> dict[str, float]:
        """Replicas and nodes for the profile's rate, and the cost of a million requests at the
        target utilisation (not rounded up to whole nodes, so profiles compare fairly)."""
        gpu_ms = self.request_gpu_ms(traffic, cached_fraction=cached_fraction)
        replica_rps = self.params.target_utilization * 1000 / gpu_ms
        replicas = max(1, math.ceil(traffic.requests_per_second / replica_rps))
        nodes = ceil_div(replicas, self.replicas_per_node)
        node_rps = replica_rps * self.replicas_per_node
        return {
            "replicaRps": replica_rps,
            "replicas": replicas,
            "nodes": nodes,
            "costPerHour": nodes * self.instance.price_per_hour,
            "costPerMillion": self.instance.price_per_hour / (node_rps * 3600) * 1e6,
        }


def _r(value: float) -> float:
    return round(value, 2)


# --- calibration data ---------------------------------------------------------------------------
# AWS blog "Tiered KV cache for large LLMs on Amazon SageMaker HyperPod with Curvine"
# (hyperpod-inference-operator.md section 6, curvine.md section 5): Qwen2-7B-Instruct fp16, TP 1,
# two ml.g5.4xlarge, serial requests of max 5 tokens, second request served from the other pod's
# L2 writes. Measured latencies include the 4 decode steps after the first token.
PUBLISHED_SWEEP_SETUP = {
    "model": "qwen2-7b",
    "instanceType": "ml.g5.4xlarge",
    "outputTokens": 5,
}
PUBLISHED_SWEEP: tuple[dict[str, float], ...] = (
    {"promptTokens": 500, "speedup": 0.99},
    {"promptTokens": 1000, "speedup": 1.7},
    {"promptTokens": 2500, "speedup": 2.7, "coldMs": 774, "warmMs": 287},
    {"promptTokens": 3000, "speedup": 2.2},
)
# The cross-node read on ml.g6e.4xlarge: "Retrieved 1925 tokens ... cost 55.75 ms, 1.84 GB/s"
# (LMCache's GB is GiB: 1925 x 57,344 B = 0.1028 GiB).
PUBLISHED_READ = {"instanceType": "ml.g6e.4xlarge", "tokens": 1925, "ms": 55.75, "gibps": 1.84}


def published_sweep_comparison(cost: CostModel) -> list[dict[str, float]]:
    """Predicted vs published latency speedups for the sweep (cost must be the sweep setup)."""
    rows = []
    decode_steps = PUBLISHED_SWEEP_SETUP["outputTokens"] - 1
    for point in PUBLISHED_SWEEP:
        n = int(point["promptTokens"])
        tail = decode_steps * cost.decode_step_ms(1, n)
        cold, warm = cost.cold_ttft_ms(n) + tail, cost.warm_ttft_ms(n) + tail
        rows.append(
            {
                "promptTokens": n,
                "predictedColdMs": _r(cold),
                "predictedWarmMs": _r(warm),
                "predictedSpeedup": round(cold / warm, 2),
                "publishedSpeedup": point["speedup"],
            }
        )
    return rows
