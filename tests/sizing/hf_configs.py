"""Published Hugging Face config.json contents of the catalog models (the fields that matter),
typed from the models' config.json files on huggingface.co."""

from __future__ import annotations

from typing import Any


def _config(model_type: str, hidden: int, inter: int, layers: int, heads: int, kv: int,
            vocab: int, context: int) -> dict[str, Any]:  # fmt: skip
    return {
        "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
        "model_type": model_type,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


HF_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-7b": _config("qwen2", 3584, 18944, 28, 28, 4, 152064, 32768),
    "qwen2.5-7b": _config("qwen2", 3584, 18944, 28, 28, 4, 152064, 32768),
    "qwen2.5-14b": _config("qwen2", 5120, 13824, 48, 40, 8, 152064, 32768),
    "qwen2.5-32b": _config("qwen2", 5120, 27648, 64, 40, 8, 152064, 32768),
    "qwen2.5-72b": _config("qwen2", 8192, 29568, 80, 64, 8, 152064, 32768),
    "llama-3.1-8b": _config("llama", 4096, 14336, 32, 32, 8, 128256, 131072),
    "llama-3.1-70b": _config("llama", 8192, 28672, 80, 64, 8, 128256, 131072),
}
