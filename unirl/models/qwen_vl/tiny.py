"""The ``tiny`` Qwen2.5-VL: a real ``Qwen2_5_VLForConditionalGeneration`` at toy size (random
init, seeded; a 2-block vision tower and a 2-layer language model) with a ChatML tokenizer
that knows the vision tokens, saved as a transformers folder. No download."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common.text_encode import token_id
from unirl.models.common_ar.tiny import build_chat_tokenizer
from unirl.models.qwen_vl.prompts import IMAGE_PAD, VISION_END, VISION_START

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TINY_BUILDER_VERSION = 1
VIDEO_PAD = "<|video_pad|>"
VISION_SPECIALS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)


@dataclass(kw_only=True, frozen=True)
class TinyQwenVLSpec:
    """Sizes of the tiny model (multimodal RoPE sections sum to head_dim / 2 = 8)."""

    seed: int = 0
    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    mrope_section: tuple[int, int, int] = (2, 3, 3)
    max_position_embeddings: int = 1024
    vision_depth: int = 2
    vision_hidden: int = 32
    vision_intermediate: int = 64
    vision_heads: int = 2


def build_tokenizer(spec: TinyQwenVLSpec) -> PreTrainedTokenizerBase:
    return build_chat_tokenizer(
        spec.vocab_size,
        extra_specials=VISION_SPECIALS,
        model_max_length=spec.max_position_embeddings,
    )


def model_config(spec: TinyQwenVLSpec, tokenizer: PreTrainedTokenizerBase) -> ConfigDict:
    """The transformers config (nested text and vision configs) of the tiny model."""
    ids = {name: token_id(tokenizer, name) for name in VISION_SPECIALS}
    eos, pad = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    return {
        "model_type": "qwen2_5_vl",
        "text_config": {
            "vocab_size": len(tokenizer),
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_hidden_layers,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "max_position_embeddings": spec.max_position_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000.0,
                "mrope_section": list(spec.mrope_section),
            },
            "tie_word_embeddings": True,
            "bos_token_id": pad,
            "eos_token_id": eos,
            "pad_token_id": pad,
        },
        "vision_config": {
            "depth": spec.vision_depth,
            "hidden_size": spec.vision_hidden,
            "intermediate_size": spec.vision_intermediate,
            "num_heads": spec.vision_heads,
            "out_hidden_size": spec.hidden_size,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "fullatt_block_indexes": [spec.vision_depth - 1],
        },
        "image_token_id": ids[IMAGE_PAD],
        "video_token_id": ids[VIDEO_PAD],
        "vision_start_token_id": ids[VISION_START],
        "vision_end_token_id": ids[VISION_END],
        "tie_word_embeddings": True,
    }


def write_tiny_qwen_vl(folder: Path, spec: TinyQwenVLSpec) -> None:
    """Build the tiny model and tokenizer and ``save_pretrained`` both into ``folder``."""
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tokenizer(spec)
    config = Qwen2_5_VLConfig.from_dict(model_config(spec, tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    with hf_progress_bars_disabled():
        model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
