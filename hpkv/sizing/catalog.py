"""Models, GPUs and instance types the sizing model knows, overridable in hpkv.yaml.

Model dimensions are the published Hugging Face ``config.json`` values; parameter counts are the
published totals (the estimate from the dimensions, :func:`estimate_params`, agrees within 0.1%).
Instance figures are the EC2 specifications of the instance family behind each ``ml.`` type.
Prices are list prices and go stale: override ``sizing.instanceTypes.<type>.pricePerHour``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpkv.errors import ConfigError, UsageError

GIB = 1 << 30


@dataclass(frozen=True)
class Model:
    key: str
    name: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    params: int
    hidden_size: int = 0  # with vocab_size: the embeddings, which do no matrix work per token
    vocab_size: int = 0
    dtype_bytes: int = 2
    tie_embeddings: bool = False
    max_context: int = 32768
    aliases: tuple[str, ...] = ()

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def matmul_params(self) -> int:
        """Parameters that do matrix work per prompt token: the embedding lookup does none, and
        vLLM computes logits (the LM head) for the last position only."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)
        return max(self.params - embeddings, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "layers": self.layers,
            "attentionHeads": self.attention_heads,
            "kvHeads": self.kv_heads,
            "headDim": self.head_dim,
            "hiddenSize": self.hidden_size,
            "vocabSize": self.vocab_size,
            "paramsBillion": round(self.params / 1e9, 3),
            "dtypeBytes": self.dtype_bytes,
            "maxContextTokens": self.max_context,
        }


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float  # total device memory as the driver reports it (what vLLM scales)
    tflops: float  # dense FP16/BF16 tensor peak
    memory_bandwidth_gbps: float  # GB/s


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: Gpu
    gpus: int
    vcpus: int
    host_memory_gib: float
    nvme_gb: float
    nvme_read_gbps: float  # GB/s, all local NVMe devices together
    network_gbps: float  # Gbit/s
    price_per_hour: float  # USD, on demand

    @property
    def network_gbytes(self) -> float:
        return self.network_gbps / 8

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": self.gpu.name,
            "gpus": self.gpus,
            "gpuMemoryGiB": self.gpu.memory_gib,
            "gpuTflops": self.gpu.tflops,
            "gpuMemoryBandwidthGBps": self.gpu.memory_bandwidth_gbps,
            "vcpus": self.vcpus,
            "hostMemoryGiB": self.host_memory_gib,
            "nvmeGB": self.nvme_gb,
            "nvmeReadGBps": self.nvme_read_gbps,
            "networkGbps": self.network_gbps,
            "pricePerHour": self.price_per_hour,
        }


# --- models: Hugging Face config.json of each (num_hidden_layers, num_attention_heads,
# num_key_value_heads, hidden_size / num_attention_heads, vocab_size, tie_word_embeddings,
# max_position_embeddings) and the model cards' parameter counts. The Qwen2-7B figures are also
# in the Qwen2 technical report (28 layers, 4 KV heads); reference: lmcache-vllm.md section 5.
def _m(key: str, name: str, *dims: int, params: float, **extra: Any) -> Model:
    layers, heads, kv_heads, head_dim, hidden, vocab, context = dims
    return Model(
        key,
        name,
        layers,
        heads,
        kv_heads,
        head_dim,
        round(params * 1e9),
        hidden_size=hidden,
        vocab_size=vocab,
        max_context=context,
        **extra,
    )


BUILTIN_MODELS: dict[str, Model] = {
    m.key: m
    for m in (
        _m("qwen2-7b", "Qwen/Qwen2-7B-Instruct", 28, 28, 4, 128, 3584, 152064, 32768, params=7.616,
           aliases=("Qwen/Qwen2-7B",)),
        _m("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 28, 28, 4, 128, 3584, 152064, 32768,
           params=7.616, aliases=("Qwen/Qwen2.5-7B",)),
        _m("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", 48, 40, 8, 128, 5120, 152064, 32768,
           params=14.770, aliases=("Qwen/Qwen2.5-14B",)),
        _m("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", 64, 40, 8, 128, 5120, 152064, 32768,
           params=32.764, aliases=("Qwen/Qwen2.5-32B",)),
        _m("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 80, 64, 8, 128, 8192, 152064, 32768,
           params=72.706, aliases=("Qwen/Qwen2.5-72B",)),
        _m("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 32, 32, 8, 128, 4096, 128256,
           131072, params=8.030, aliases=("meta-llama/Meta-Llama-3.1-8B-Instruct",)),
        _m("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 80, 64, 8, 128, 8192, 128256,
           131072, params=70.554, aliases=("meta-llama/Meta-Llama-3.1-70B-Instruct",)),
    )
}  # fmt: skip

# --- GPUs. Memory: total MiB that nvidia-smi reports / 1024. Dense tensor peaks: NVIDIA L40S,
# A100 and H100 SXM datasheets; A10G (AWS's A10 variant) from Baseten's "NVIDIA A10 vs A10G"
# spec comparison (70 TFLOPS FP16 tensor; the A10's 125 does not apply). Bandwidth: datasheets.
BUILTIN_GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu("A10G", 22.49, 70.0, 600.0),
        Gpu("L40S", 44.99, 362.0, 864.0),
        Gpu("A100-40GB", 40.0, 312.0, 1555.0),
        Gpu("H100-80GB", 79.65, 989.0, 3350.0),
    )
}


# --- instance types: aws.amazon.com/ec2/instance-types/{g5,g6e,p4,p5} (GPUs, vCPUs, memory GiB,
# instance-store NVMe GB, network Gbit/s; "up to" figures taken at their burst value).
# nvmeReadGBps: AWS publishes no sequential-read figure for these instance stores; estimated per
# device at 2.0 GB/s (g5, p4d), 3.0 GB/s (g6e) and 3.5 GB/s (p5), times the device count. Measure
# yours (fio, 256 KiB sequential reads) and set sizing.instanceTypes.<type>.nvmeReadGBps.
# pricePerHour: Amazon SageMaker AI on-demand list prices, us-east-1, USD
# (aws.amazon.com/sagemaker/pricing/, 2025; HyperPod and Savings Plans prices differ).
def _i(name: str, gpu: str, gpus: int, vcpus: int, mem: float, nvme: float, devices: int,
       per_device: float, net: float, price: float) -> InstanceType:  # fmt: skip
    return InstanceType(
        name, BUILTIN_GPUS[gpu], gpus, vcpus, mem, nvme, devices * per_device, net, price
    )


BUILTIN_INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        _i("ml.g5.xlarge", "A10G", 1, 4, 16, 250, 1, 2.0, 10, 1.408),
        _i("ml.g5.2xlarge", "A10G", 1, 8, 32, 450, 1, 2.0, 10, 1.515),
        _i("ml.g5.4xlarge", "A10G", 1, 16, 64, 600, 1, 2.0, 25, 2.03),
        _i("ml.g5.8xlarge", "A10G", 1, 32, 128, 900, 1, 2.0, 25, 3.06),
        _i("ml.g5.12xlarge", "A10G", 4, 48, 192, 3800, 1, 2.0, 40, 7.09),
        _i("ml.g5.16xlarge", "A10G", 1, 64, 256, 1900, 1, 2.0, 25, 4.60),
        _i("ml.g5.24xlarge", "A10G", 4, 96, 384, 3800, 1, 2.0, 50, 10.18),
        _i("ml.g5.48xlarge", "A10G", 8, 192, 768, 7600, 2, 2.0, 100, 20.36),
        _i("ml.g6e.xlarge", "L40S", 1, 4, 32, 250, 1, 3.0, 20, 2.264),
        _i("ml.g6e.2xlarge", "L40S", 1, 8, 64, 450, 1, 3.0, 20, 2.744),
        _i("ml.g6e.4xlarge", "L40S", 1, 16, 128, 600, 1, 3.0, 20, 3.672),
        _i("ml.g6e.8xlarge", "L40S", 1, 32, 256, 900, 1, 3.0, 25, 5.534),
        _i("ml.g6e.12xlarge", "L40S", 4, 48, 384, 3800, 2, 3.0, 100, 12.825),
        _i("ml.g6e.16xlarge", "L40S", 1, 64, 512, 1900, 1, 3.0, 35, 9.256),
        _i("ml.g6e.24xlarge", "L40S", 4, 96, 768, 3800, 2, 3.0, 200, 18.422),
        _i("ml.g6e.48xlarge", "L40S", 8, 192, 1536, 7600, 4, 3.0, 400, 36.844),
        _i("ml.p4d.24xlarge", "A100-40GB", 8, 96, 1152, 8000, 8, 2.0, 400, 37.688),
        _i("ml.p5.48xlarge", "H100-80GB", 8, 192, 2048, 30720, 8, 3.5, 3200, 113.07),
    )
}


# --- hpkv.yaml: sizing.models / sizing.gpus / sizing.instanceTypes -----------------------------
MODEL_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    # yaml key -> (Model field, JSON schema)
    "name": ("name", {"type": "string", "minLength": 1}),
    "layers": ("layers", {"type": "integer", "minimum": 1}),
    "attentionHeads": ("attention_heads", {"type": "integer", "minimum": 1}),
    "kvHeads": ("kv_heads", {"type": "integer", "minimum": 1}),
    "headDim": ("head_dim", {"type": "integer", "minimum": 1}),
    "hiddenSize": ("hidden_size", {"type": "integer", "minimum": 1}),
    "vocabSize": ("vocab_size", {"type": "integer", "minimum": 1}),
    "paramsBillion": ("params", {"type": "number", "exclusiveMinimum": 0}),
    "dtypeBytes": ("dtype_bytes", {"type": "integer", "enum": [1, 2, 4]}),
    "maxContextTokens": ("max_context", {"type": "integer", "minimum": 1}),
    "tieEmbeddings": ("tie_embeddings", {"type": "boolean"}),
}
GPU_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    "memoryGiB": ("memory_gib", {"type": "number", "exclusiveMinimum": 0}),
    "tflops": ("tflops", {"type": "number", "exclusiveMinimum": 0}),
    "memoryBandwidthGBps": ("memory_bandwidth_gbps", {"type": "number", "exclusiveMinimum": 0}),
}
INSTANCE_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpu": ("gpu", {"type": "string", "minLength": 1}),
    "gpus": ("gpus", {"type": "integer", "minimum": 1}),
    "vcpus": ("vcpus", {"type": "integer", "minimum": 1}),
    "hostMemoryGiB": ("host_memory_gib", {"type": "number", "exclusiveMinimum": 0}),
    "nvmeGB": ("nvme_gb", {"type": "number", "minimum": 0}),
    "nvmeReadGBps": ("nvme_read_gbps", {"type": "number", "exclusiveMinimum": 0}),
    "networkGbps": ("network_gbps", {"type": "number", "exclusiveMinimum": 0}),
    "pricePerHour": ("price_per_hour", {"type": "number", "minimum": 0}),
}


def _entries_schema(fields: dict[str, tuple[str, dict[str, Any]]], extra: dict[str, Any]) -> dict:
    return {
        "type": "object",
        "additionalProperties": {
            "type": "object",
            "additionalProperties": False,
            "properties": {**{k: schema for k, (_f, schema) in fields.items()}, **extra},
        },
    }


CATALOG_SCHEMA: dict[str, Any] = {
    "models": _entries_schema(
        MODEL_FIELDS,
        {
            "hfConfig": {
                "type": "string",
                "minLength": 1,
                "description": "a path to a Hugging Face config.json (or its folder)",
            },
            "aliases": {"type": "array", "items": {"type": "string"}},
        },
    ),
    "gpus": _entries_schema(GPU_FIELDS, {}),
    "instanceTypes": _entries_schema(INSTANCE_FIELDS, {}),
}


@dataclass
class Catalog:
    models: dict[str, Model] = field(default_factory=lambda: dict(BUILTIN_MODELS))
    gpus: dict[str, Gpu] = field(default_factory=lambda: dict(BUILTIN_GPUS))
    instance_types: dict[str, InstanceType] = field(
        default_factory=lambda: dict(BUILTIN_INSTANCE_TYPES)
    )

    @classmethod
    def from_config(cls, section: Mapping[str, Any], *, base_dir: Path | None = None) -> Catalog:
        """The built-in catalog with ``sizing.models/gpus/instanceTypes`` merged over it."""
        catalog = cls()
        for name, values in (section.get("gpus") or {}).items():
            catalog.gpus[name] = _merge(
                catalog.gpus.get(name), Gpu, GPU_FIELDS, values, f"sizing.gpus.{name}", name=name
            )
        for name, values in (section.get("instanceTypes") or {}).items():
            values = dict(values)
            if "gpu" in values:
                values["gpu"] = catalog.gpu(values["gpu"], where=f"sizing.instanceTypes.{name}.gpu")
            catalog.instance_types[name] = _merge(
                catalog.instance_types.get(name),
                InstanceType,
                INSTANCE_FIELDS,
                values,
                f"sizing.instanceTypes.{name}",
                name=name,
            )
        for key, values in (section.get("models") or {}).items():
            catalog.models[key] = _model_from_config(
                key, values, catalog.models.get(key), base_dir=base_dir
            )
        return catalog

    # --- lookups ------------------------------------------------------------------------------
    def gpu(self, name: str, *, where: str = "gpu") -> Gpu:
        if name in self.gpus:
            return self.gpus[name]
        raise ConfigError(
            f"{where}: unknown GPU '{name}'",
            fix=_choose_fix(name, self.gpus, "add it under sizing.gpus in hpkv.yaml"),
        )

    def instance_type(self, name: str) -> InstanceType:
        for candidate in (name, f"ml.{name}"):
            if candidate in self.instance_types:
                return self.instance_types[candidate]
        raise UsageError(
            f"unknown instance type '{name}'",
            fix=_choose_fix(name, self.instance_types, "add it under sizing.instanceTypes"),
        )

    def model(self, name: str) -> Model:
        """A catalog key, a Hugging Face id or alias, or a path to a config.json (or its folder)."""
        if name in self.models:
            return self.models[name]
        wanted = _normalise(name)
        for model in self.models.values():
            if wanted in {_normalise(n) for n in (model.key, model.name, *model.aliases)}:
                return model
        path = Path(name).expanduser()
        if path.exists() or name.endswith(".json"):
            return model_from_hf_config(path)
        raise UsageError(
            f"unknown model '{name}'",
            fix=_choose_fix(
                name,
                self.models,
                "or pass the path of a Hugging Face config.json, or add it under sizing.models",
            ),
        )


def _normalise(name: str) -> str:
    base = name.strip().lower().rsplit("/", 1)[-1]
    base = base.removeprefix("meta-")
    for suffix in ("-instruct", "-chat", "-it"):
        base = base.removesuffix(suffix)
    return base


def _choose_fix(name: str, known: Mapping[str, Any], other: str) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"{hint}known: {', '.join(sorted(known))}; {other}"


def _merge(
    base: Any,
    cls: type,
    fields: dict[str, tuple[str, dict[str, Any]]],
    values: Mapping[str, Any],
    where: str,
    **fixed: Any,
) -> Any:
    converted = {fields[k][0]: v for k, v in values.items() if k in fields}
    if "params" in converted:
        converted["params"] = round(float(converted["params"]) * 1e9)
    converted.update(fixed)
    if base is not None:
        return replace(base, **converted)
    missing = [k for k, (attr, _s) in fields.items() if attr not in converted and k != "name"]
    required = [k for k in missing if not _has_default(cls, fields[k][0])]
    if required:
        raise ConfigError(
            f"{where} is new and lacks {', '.join(required)}",
            fix=f"set {', '.join(f'{where}.{k}' for k in required)}",
        )
    return cls(**converted)


def _has_default(cls: type, attr: str) -> bool:
    spec = cls.__dataclass_fields__[attr]  # type: ignore[attr-defined]
    return spec.default is not MISSING or spec.default_factory is not MISSING


def _model_from_config(
    key: str, values: Mapping[str, Any], base: Model | None, *, base_dir: Path | None
) -> Model:
    where = f"sizing.models.{key}"
    if "hfConfig" in values:
        path = Path(values["hfConfig"]).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        base = replace(model_from_hf_config(path), key=key)
    aliases = tuple(values.get("aliases") or ())
    fields = {k: v for k, v in values.items() if k in MODEL_FIELDS}
    if base is None and "name" not in fields:
        fields["name"] = key
    model = _merge(base, Model, MODEL_FIELDS, fields, where, key=key)
    if aliases:
        model = replace(model, aliases=aliases)
    _check_model(model, where)
    return model


def _check_model(model: Model, where: str) -> None:
    if model.attention_heads % model.kv_heads:
        raise ConfigError(
            f"{where}: attentionHeads {model.attention_heads} is not a multiple of kvHeads "
            f"{model.kv_heads}",
            fix="copy num_attention_heads and num_key_value_heads from the model's config.json",
        )


# --- Hugging Face config.json ------------------------------------------------------------------
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8": 1, "fp8": 1}


def model_from_hf_config(path: Path) -> Model:
    """A model from a local Hugging Face ``config.json`` (dense decoder-only transformers)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"model config {file} does not exist",
            fix="pass a catalog key (see 'hpkv plan --help') or the path of a config.json",
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"cannot read {file} as a Hugging Face config.json: {exc}",
            fix="download the model's config.json (huggingface-cli download <id> config.json)",
        ) from None
    if not isinstance(config, dict):
        raise UsageError(f"{file} is not a JSON object", fix="pass the model's config.json")
    config = config.get("text_config", config) if "num_hidden_layers" not in config else config
    if any(k in config for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        raise UsageError(
            f"{file} describes a mixture-of-experts model, which the sizing model does not cover",
            fix="add it under sizing.models with paramsBillion (all experts) and the KV dimensions",
        )
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"{file} lacks {exc} (not a decoder-only transformer config)",
            fix="add the model under sizing.models with layers, kvHeads, headDim, paramsBillion",
        ) from None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    vocab = int(config.get("vocab_size") or 0)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    tie = bool(config.get("tie_word_embeddings", False))
    name = str(config.get("_name_or_path") or file.parent.name or file.stem)
    model = Model(
        key=_normalise(name) or file.parent.name,
        name=name,
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=vocab,
        params=estimate_params(config),
        dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
        tie_embeddings=tie,
        max_context=int(config.get("max_position_embeddings") or 32768),
    )
    _check_model(model, str(file))
    return model


def estimate_params(config: Mapping[str, Any]) -> int:
    """Parameter count of a Llama/Qwen/Mistral-style decoder from its config.json."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config.get("intermediate_size") or 4 * hidden)
    vocab = int(config.get("vocab_size") or 0)
    layers = int(config["num_hidden_layers"])
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = hidden * q + 2 * hidden * kv + q * hidden
    if config.get("attention_bias") or config.get("model_type") in ("qwen2",):
        attention += q + 2 * kv
    gated = str(config.get("hidden_act", "silu")) in ("silu", "swiglu", "gelu_pytorch_tanh")
    mlp = (3 if gated else 2) * hidden * inter
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + hidden


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
