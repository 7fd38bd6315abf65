"""``qwen2.5-vl-*-arch`` presets: the released Qwen2.5-VL shapes with random weights (as each
checkpoint's ``config.json`` publishes them)."""

from __future__ import annotations

from unirl.models.common.config_dict import ConfigDict

_VISION: ConfigDict = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
_IDS: ConfigDict = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}
_ROPE: ConfigDict = {
    "rope_type": "default",
    "rope_theta": 1_000_000.0,
    "mrope_section": [16, 24, 24],
}

ARCH_CONFIGS: dict[str, ConfigDict] = {
    "qwen2.5-vl-3b-arch": {
        "model_type": "qwen2_5_vl",
        "text_config": {
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128000,
            "rope_parameters": dict(_ROPE),
            "tie_word_embeddings": True,
        },
        "vision_config": {**_VISION, "out_hidden_size": 2048},
        "tie_word_embeddings": True,
        **_IDS,
    },
    "qwen2.5-vl-7b-arch": {
        "model_type": "qwen2_5_vl",
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 128000,
            "rope_parameters": dict(_ROPE),
            "tie_word_embeddings": False,
        },
        "vision_config": {**_VISION, "out_hidden_size": 3584},
        "tie_word_embeddings": False,
        **_IDS,
    },
}


def arch_config(name: str) -> ConfigDict:
    """A deep copy of the transformers config of preset ``name``."""
    import copy

    if name not in ARCH_CONFIGS:
        raise KeyError(f"unknown Qwen2.5-VL arch preset {name!r}; known: {sorted(ARCH_CONFIGS)}")
    return copy.deepcopy(ARCH_CONFIGS[name])
