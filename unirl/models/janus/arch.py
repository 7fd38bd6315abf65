"""``janus-pro-*-arch`` presets: the released Janus-Pro shapes with random weights (benchmarks,
memory planning, offline dry runs).

Source of the numbers: the ``config.json`` of ``deepseek-ai/Janus-Pro-1B`` and
``deepseek-ai/Janus-Pro-7B`` (``language_config``: a LLaMA-style DeepSeek-LLM; ``vision_config``:
SigLIP-L/16 at 384 px; ``aligner_config`` / ``gen_aligner_config`` / ``gen_head_config``:
2-layer GELU MLPs at the LLM width; ``gen_vision_config``: the VQ-16 tokenizer, 16,384 codes of
dimension 8, 24 x 24 = 576 tokens per 384 px image), in the layout transformers'
``JanusConfig`` takes (``convert_janus_weights_to_hf.py`` maps one onto the other: the VQ
decoder's channel multipliers, resolution blocks and latent channels are that converter's
``JanusVQVAEConfig`` defaults). Special ids are the released tokenizer's: ``<｜begin▁of▁sentence｜>``
100000, ``<｜end▁of▁sentence｜>`` 100001, ``<｜▁pad▁｜>`` 100015, ``<begin_of_image>`` 100016,
``<image_placeholder>`` 100581.
"""

from __future__ import annotations

import copy
from typing import Any

BOS_ID, EOS_ID, PAD_ID, BOI_ID, IMAGE_PLACEHOLDER_ID = 100000, 100001, 100015, 100016, 100581


def _janus(hidden: int, intermediate: int, layers: int, heads: int) -> dict[str, Any]:
    return {
        "text_config": {
            "model_type": "llama",
            "vocab_size": 102400,
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "hidden_act": "silu",
            "max_position_embeddings": 16384,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
        },
        "vision_config": {
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "image_size": 384,
            "patch_size": 16,
            "mlp_ratio": 4.0,
            "projection_dim": hidden,
            "depth": 2,
            "num_image_tokens": 576,
        },
        "vq_config": {
            "embed_dim": 8,
            "num_embeddings": 16384,
            "latent_channels": 256,
            "base_channels": 128,
            "channel_multiplier": [1, 1, 2, 2, 4],
            "num_res_blocks": 2,
            "projection_dim": hidden,
            "image_token_embed_dim": hidden,
            "num_hidden_layers": 2,
        },
        "image_token_id": IMAGE_PLACEHOLDER_ID,
        "tie_word_embeddings": False,
    }


ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "janus-pro-1b-arch": _janus(hidden=2048, intermediate=5632, layers=24, heads=16),
    "janus-pro-7b-arch": _janus(hidden=4096, intermediate=11008, layers=30, heads=32),
}


def arch_config(name: str) -> dict[str, Any]:
    """A copy of the transformers ``JanusConfig`` (as a dict) of preset ``name``."""
    if name not in ARCH_CONFIGS:
        raise KeyError(f"unknown Janus arch preset {name!r}; known: {sorted(ARCH_CONFIGS)}")
    return copy.deepcopy(ARCH_CONFIGS[name])
