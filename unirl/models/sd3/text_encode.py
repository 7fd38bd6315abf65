"""SD3 prompt encoding, computed as ``StableDiffusion3Pipeline.encode_prompt`` computes it.

Per prompt: CLIP-L and CLIP-G penultimate hidden states (77 tokens each) concatenated on
the feature axis and zero-padded to the T5 width; T5 last hidden state (``max_sequence_length``
tokens); the joint sequence is ``cat([clip, t5], dim=1)``. Pooled = ``cat([clip_l_proj,
clip_g_proj], dim=-1)``. Tokenisation pads to max length with truncation and passes no
attention mask, exactly as diffusers does, so embeddings match it element for element.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from unirl.models.common.text_encode import module_device, module_dtype


@dataclass
class SD3TextStack:
    """The modules one encode call uses; ``text_encoder_3`` is None when T5 is skipped."""

    tokenizer: Any
    tokenizer_2: Any
    tokenizer_3: Any
    text_encoder: torch.nn.Module
    text_encoder_2: torch.nn.Module
    text_encoder_3: torch.nn.Module | None
    joint_attention_dim: int
    clip_max_length: int = 77


def clip_embeds(
    tokenizer: Any, encoder: torch.nn.Module, texts: Sequence[str], max_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden[N, 77, D], pooled[N, P])``: penultimate hidden states and projected pooled output."""
    ids = tokenizer(
        list(texts),
        padding="max_length",
        max_length=max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids
    out = encoder(ids.to(module_device(encoder)), output_hidden_states=True)
    return out.hidden_states[-2], out[0]


def t5_embeds(
    tokenizer: Any, encoder: torch.nn.Module, texts: Sequence[str], max_sequence_length: int
) -> torch.Tensor:
    """``hidden[N, max_sequence_length, D_t5]``: T5 encoder last hidden state."""
    ids = tokenizer(
        list(texts),
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        add_special_tokens=True,
        return_tensors="pt",
    ).input_ids
    return encoder(ids.to(module_device(encoder)))[0]


def t5_placeholder_embeds(
    texts: Sequence[str],
    *,
    length: int,
    width: int,
    kind: str,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Stand-in T5 embeddings ``[N, length, width]`` when T5 is skipped.

    ``zeros`` is what diffusers feeds without ``text_encoder_3``; ``random`` is N(0, 1) seeded
    from each prompt's text, so a prompt always maps to the same embedding (benchmarks only).
    """
    if kind == "zeros":
        return torch.zeros((len(texts), length, width), dtype=dtype, device=device)
    if kind != "random":
        raise ValueError(f"t5 placeholder {kind!r} must be 'zeros' or 'random'")
    rows = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        gen = torch.Generator().manual_seed(seed)
        rows.append(torch.randn((length, width), generator=gen))
    return torch.stack(rows).to(device=device, dtype=dtype)


@torch.no_grad()
def encode_sd3_prompts(
    stack: SD3TextStack,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
    t5_placeholder: str = "zeros",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_embeds[N, 77 + L, D_t5], pooled[N, D_l + D_g])`` for ``texts``, one row each.

    Dtypes follow diffusers: CLIP states in CLIP-L's dtype, T5 states in T5's dtype.
    """
    if not texts:
        raise ValueError("encode_sd3_prompts: no texts to encode")
    hidden_l, pooled_l = clip_embeds(
        stack.tokenizer, stack.text_encoder, texts, stack.clip_max_length
    )
    hidden_g, pooled_g = clip_embeds(
        stack.tokenizer_2, stack.text_encoder_2, texts, stack.clip_max_length
    )
    clip_dtype = module_dtype(stack.text_encoder)
    clip = torch.cat([hidden_l.to(clip_dtype), hidden_g.to(clip_dtype)], dim=-1)

    if stack.text_encoder_3 is not None:
        t5 = t5_embeds(stack.tokenizer_3, stack.text_encoder_3, texts, max_sequence_length)
        t5 = t5.to(module_dtype(stack.text_encoder_3))
    else:
        t5 = t5_placeholder_embeds(
            texts,
            length=max_sequence_length,
            width=stack.joint_attention_dim,
            kind=t5_placeholder,
            dtype=clip_dtype,
            device=clip.device,
        )
    if clip.shape[-1] > t5.shape[-1]:
        raise ValueError(
            f"CLIP width {clip.shape[-1]} exceeds the T5 width {t5.shape[-1]}; SD3 pads CLIP up to T5"
        )
    clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
    prompt_embeds = torch.cat([clip, t5.to(clip.device)], dim=-2)
    pooled = torch.cat([pooled_l, pooled_g], dim=-1)
    return prompt_embeds, pooled
