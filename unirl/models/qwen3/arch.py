"""``qwen3-*-arch`` presets: the released Qwen3 shapes with random weights (benchmarks, memory
planning, offline dry runs). Shapes as published in each checkpoint's ``config.json``."""

from __future__ import annotations

from unirl.models.common.config_dict import ConfigDict

_COMMON: ConfigDict = {
    "vocab_size": 151936,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "max_position_embeddings": 40960,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

ARCH_CONFIGS: dict[str, ConfigDict] = {
    "qwen3-0.6b-arch": {
        **_COMMON,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "qwen3-1.7b-arch": {
        **_COMMON,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "qwen3-4b-arch": {
        **_COMMON,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": True,
    },
    "qwen3-8b-arch": {
        **_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
}


def arch_config(name: str) -> ConfigDict:
    """A copy of the transformers config of preset ``name``."""
    if name not in ARCH_CONFIGS:
        raise KeyError(f"unknown Qwen3 arch preset {name!r}; known: {sorted(ARCH_CONFIGS)}")
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in ARCH_CONFIGS[name].items()}
