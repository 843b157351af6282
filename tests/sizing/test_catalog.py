"""The catalog: published model dimensions, instance types, Hugging Face configs, hpkv.yaml overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpkv.errors import ConfigError, UsageError
from hpkv.sizing.catalog import BUILTIN_MODELS, Catalog, estimate_params, model_from_hf_config
from tests.sizing.hf_configs import HF_CONFIGS


@pytest.mark.parametrize(
    ("key", "kv_bytes"),
    [
        ("qwen2-7b", 57_344),  # 2 x 28 layers x 4 KV heads x 128 x 2 bytes
        ("llama-3.1-70b", 327_680),  # 2 x 80 x 8 x 128 x 2
        ("llama-3.1-8b", 131_072),
        ("qwen2.5-32b", 262_144),
    ],
)
def test_kv_bytes_per_token(key: str, kv_bytes: int) -> None:
    assert BUILTIN_MODELS[key].kv_bytes_per_token == kv_bytes


@pytest.mark.parametrize("key", sorted(HF_CONFIGS))
def test_catalog_params_match_the_published_configs(key: str) -> None:
    model = BUILTIN_MODELS[key]
    config = HF_CONFIGS[key]
    assert estimate_params(config) == pytest.approx(model.params, rel=2e-4)
    assert model.layers == config["num_hidden_layers"]
    assert model.kv_heads == config["num_key_value_heads"]
    assert model.attention_heads == config["num_attention_heads"]
    assert model.head_dim == config["hidden_size"] // config["num_attention_heads"]


def test_model_from_a_hugging_face_config_file_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen2-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({**HF_CONFIGS["qwen2-7b"], "_name_or_path": "Qwen/Qwen2-7B-Instruct"})
    )
    for path in (folder, folder / "config.json"):
        model = model_from_hf_config(path)
        assert model.kv_bytes_per_token == 57_344
        assert model.params == 7_615_616_512
        assert model.max_context == 32768
        assert model.name == "Qwen/Qwen2-7B-Instruct"


def test_hugging_face_config_problems_are_one_line_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        model_from_hf_config(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read"):
        model_from_hf_config(broken)
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**HF_CONFIGS["qwen2-7b"], "num_experts": 64}))
    with pytest.raises(UsageError, match="mixture-of-experts") as info:
        model_from_hf_config(moe)
    assert info.value.fix and "sizing.models" in info.value.fix
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(UsageError, match="num_hidden_layers"):
        model_from_hf_config(partial)


@pytest.mark.parametrize(
    "name",
    ["qwen2-7b", "Qwen/Qwen2-7B-Instruct", "Qwen/Qwen2-7B", "Qwen2-7B-Instruct", "QWEN2-7B"],
)
def test_model_lookup_accepts_keys_ids_and_aliases(name: str) -> None:
    assert Catalog().model(name).key == "qwen2-7b"


def test_unknown_names_suggest_the_closest() -> None:
    catalog = Catalog()
    with pytest.raises(UsageError, match=r"unknown model 'llama-3\.1-7b'") as info:
        catalog.model("llama-3.1-7b")
    assert "did you mean 'llama-3.1-70b'" in (info.value.fix or "")
    assert catalog.instance_type("g6e.4xlarge").name == "ml.g6e.4xlarge"
    with pytest.raises(UsageError, match="unknown instance type") as info:
        catalog.instance_type("ml.g6e.5xlarge")
    assert "ml.g6e" in (info.value.fix or "")


def test_instance_catalog_covers_the_inference_families() -> None:
    types = Catalog().instance_types
    for family in ("ml.g5.", "ml.g6e.", "ml.p4d.", "ml.p5."):
        assert any(name.startswith(family) for name in types), family
    g6e = types["ml.g6e.4xlarge"]
    assert (g6e.gpus, g6e.gpu.name, g6e.host_memory_gib, g6e.nvme_gb, g6e.network_gbps) == (
        1,
        "L40S",
        128,
        600,
        20,
    )
    p5 = types["ml.p5.48xlarge"]
    assert (p5.gpus, p5.gpu.name, p5.host_memory_gib, p5.network_gbps) == (
        8,
        "H100-80GB",
        2048,
        3200,
    )
    assert all(t.price_per_hour > 0 for t in types.values())


def test_hpkv_yaml_overrides_and_additions(tmp_path: Path) -> None:
    (tmp_path / "mistral.json").write_text(
        json.dumps({**HF_CONFIGS["llama-3.1-8b"], "vocab_size": 32768, "num_hidden_layers": 32})
    )
    catalog = Catalog.from_config(
        {
            "instanceTypes": {
                "ml.g6e.4xlarge": {"pricePerHour": 2.5},
                "ml.g7.2xlarge": {
                    "gpu": "B200-small",
                    "gpus": 2,
                    "vcpus": 16,
                    "hostMemoryGiB": 256,
                    "nvmeGB": 1900,
                    "nvmeReadGBps": 6,
                    "networkGbps": 50,
                    "pricePerHour": 9,
                },
            },
            "gpus": {"B200-small": {"memoryGiB": 90, "tflops": 1000, "memoryBandwidthGBps": 4000}},
            "models": {
                "qwen2-7b": {"maxContextTokens": 131072},
                "mistral": {"hfConfig": "mistral.json"},
                "tiny": {"layers": 2, "attentionHeads": 4, "kvHeads": 2, "headDim": 64,
                         "paramsBillion": 0.1},
            },
        },
        base_dir=tmp_path,
    )  # fmt: skip
    assert catalog.instance_type("ml.g6e.4xlarge").price_per_hour == 2.5
    assert catalog.instance_type("ml.g6e.4xlarge").gpu.name == "L40S"  # the rest kept
    added = catalog.instance_type("ml.g7.2xlarge")
    assert (added.gpu.memory_gib, added.gpus) == (90, 2)
    assert catalog.model("qwen2-7b").max_context == 131072
    assert catalog.model("qwen2-7b").kv_bytes_per_token == 57_344
    assert catalog.model("mistral").key == "mistral"
    assert catalog.model("mistral").vocab_size == 32768
    tiny = catalog.model("tiny")
    assert (tiny.kv_bytes_per_token, tiny.params) == (2 * 2 * 2 * 64 * 2, 100_000_000)


def test_incomplete_or_inconsistent_additions_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"sizing.instanceTypes.ml.x1 is new and lacks") as info:
        Catalog.from_config({"instanceTypes": {"ml.x1": {"gpu": "L40S", "gpus": 1}}})
    assert "sizing.instanceTypes.ml.x1.pricePerHour" in (info.value.fix or "")
    with pytest.raises(ConfigError, match="unknown GPU 'H300'"):
        Catalog.from_config({"instanceTypes": {"ml.g6e.4xlarge": {"gpu": "H300"}}})
    with pytest.raises(ConfigError, match="not a multiple of kvHeads"):
        Catalog.from_config({"models": {"qwen2-7b": {"kvHeads": 5}}})
