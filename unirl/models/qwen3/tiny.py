"""The ``tiny`` Qwen3: a real ``Qwen3ForCausalLM`` at toy size (random init, seeded) with a
ChatML tokenizer trained locally (``unirl.models.common_ar.tiny``), saved as a transformers
folder. No download; a few hundred thousand parameters; seconds to build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common_ar.tiny import build_chat_tokenizer

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1


@dataclass(kw_only=True, frozen=True)
class TinyQwen3Spec:
    """Sizes of the tiny model. Grouped-query attention (4 heads over 2 KV heads) and a
    head_dim that is not hidden / heads keep the real model's code paths in play."""

    seed: int = 0
    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True


def model_config(
    spec: TinyQwen3Spec, *, vocab_size: int, eos_token_id: int, pad_token_id: int
) -> ConfigDict:
    """The transformers config of the tiny model (``vocab_size``: the tokenizer's)."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
        "bos_token_id": pad_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }


def write_tiny_qwen3(folder: Path, spec: TinyQwen3Spec) -> None:
    """Build the tiny model and tokenizer and ``save_pretrained`` both into ``folder``."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_chat_tokenizer(spec.vocab_size, model_max_length=spec.max_position_embeddings)
    config = Qwen3Config.from_dict(
        model_config(
            spec,
            vocab_size=len(tokenizer),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    with hf_progress_bars_disabled():
        model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
