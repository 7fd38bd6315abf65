"""The ``tiny`` Janus: a real ``JanusForConditionalGeneration`` at toy size (random init,
seeded) with a ChatML tokenizer trained locally, saved as a transformers folder. No download;
about 1.7M parameters, 1.6M of them the VQ model; seconds to build.

Every part of the real model is there at toy width: the LLaMA decoder (2 layers, hidden 64,
grouped-query attention), the SigLIP vision tower and its aligner (understanding), the VQ
tokenizer's decoder, the generation embeddings, aligner and head (image tokens). A 32 px image
is 4 x 4 = 16 image tokens from a 64-code book. The VQ decoder is 64 channels wide: its last
GroupNorm (32 groups) then holds two channels per group, so an image's mean brightness survives
the normalisation and depends on which codes the policy picks (at 32 channels, one per group,
every code decodes to nearly the same brightness: 0.513-0.516 over 64 random images, against
0.453-0.470 at 64 channels), which is what the brightness quick start learns from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common_ar.tiny import CHATML_TEMPLATE, build_chat_tokenizer

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1

BOS, BOI, EOI, IMAGE_PLACEHOLDER = (
    "<|begin_of_sentence|>",
    "<begin_of_image>",
    "<end_of_image>",
    "<image_placeholder>",
)
JANUS_SPECIALS = (BOS, BOI, EOI, IMAGE_PLACEHOLDER)


@dataclass(kw_only=True, frozen=True)
class TinyJanusSpec:
    """Sizes of the tiny model (see the module docstring)."""

    seed: int = 0
    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    vision_hidden_size: int = 32
    image_size: int = 32
    patch_size: int = 8
    codebook_size: int = 64
    vq_base_channels: int = 64


def tiny_tokenizer(spec: TinyJanusSpec) -> Any:
    """The ChatML tokenizer with Janus's specials; its chat template starts with BOS (the
    unconditional branch of image generation keeps BOS and ``<begin_of_image>`` only)."""
    tokenizer = build_chat_tokenizer(
        spec.vocab_size,
        extra_specials=JANUS_SPECIALS,
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.bos_token = BOS
    tokenizer.chat_template = "{{ bos_token }}" + CHATML_TEMPLATE
    return tokenizer


def model_config(spec: TinyJanusSpec, tokenizer: Any) -> dict[str, Any]:
    """The transformers ``JanusConfig`` (as a dict) of the tiny model."""
    grid = spec.image_size // spec.patch_size
    ids = tokenizer.convert_tokens_to_ids
    return {
        "text_config": {
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_hidden_layers,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "max_position_embeddings": spec.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
            "bos_token_id": ids(BOS),
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        "vision_config": {
            "hidden_size": spec.vision_hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": spec.image_size,
            "patch_size": spec.patch_size,
            "projection_dim": spec.hidden_size,
            "depth": 2,
            "num_image_tokens": grid * grid,
        },
        "vq_config": {
            "embed_dim": 8,
            "num_embeddings": spec.codebook_size,
            "latent_channels": spec.vq_base_channels,
            "base_channels": spec.vq_base_channels,
            # 3 upsamplings: a 4 x 4 token grid decodes to 32 x 32 pixels
            "channel_multiplier": [1, 1, 1, 1],
            "num_res_blocks": 1,
            "projection_dim": spec.hidden_size,
            "image_token_embed_dim": spec.hidden_size,
            "num_hidden_layers": 2,
        },
        "image_token_id": ids(IMAGE_PLACEHOLDER),
        "tie_word_embeddings": False,
    }


def generation_config(tokenizer: Any) -> Any:
    """What transformers' ``generate`` reads: eos / pad / bos, and ``boi_token_id`` (its image
    mode's unconditional branch keeps BOS and ``<begin_of_image>``)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        generation_kwargs={"boi_token_id": tokenizer.convert_tokens_to_ids(BOI)},
    )


def write_tiny_janus(folder: Path, spec: TinyJanusSpec) -> None:
    """Build the tiny model and tokenizer and ``save_pretrained`` both into ``folder``."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    tokenizer = tiny_tokenizer(spec)
    config = JanusConfig.from_dict(model_config(spec, tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = JanusForConditionalGeneration(config)
    model.generation_config = generation_config(tokenizer)
    with hf_progress_bars_disabled():
        model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
