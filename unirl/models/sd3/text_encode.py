"""SD3 prompt encoding, computed as ``StableDiffusion3Pipeline.encode_prompt`` computes it.

Per prompt: CLIP-L and CLIP-G penultimate hidden states (77 tokens each) concatenated on
the feature axis and zero-padded to the T5 width; T5 last hidden state (``max_sequence_length``
tokens); the joint sequence is ``cat([clip, t5], dim=1)``. Pooled = ``cat([clip_l_proj,
clip_g_proj], dim=-1)``. Tokenisation pads to max length with truncation and passes no
attention mask, exactly as diffusers does, so embeddings match it element for element.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.text_encode import module_device, module_dtype, warn_truncated_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class SD3TextStack:
    """The modules one encode call uses; ``text_encoder_3`` is None when T5 is skipped."""

    tokenizer: PreTrainedTokenizerBase
    tokenizer_2: PreTrainedTokenizerBase
    tokenizer_3: PreTrainedTokenizerBase
    text_encoder: torch.nn.Module
    text_encoder_2: torch.nn.Module
    text_encoder_3: torch.nn.Module | None
    joint_attention_dim: int
    clip_max_length: int = 77


def _token_ids(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int, **extra: Any
) -> torch.Tensor:
    """Token ids ``[N, max_length]`` padded to ``max_length`` with truncation, no mask (as
    diffusers tokenises for SD3)."""
    return tokenizer(
        list(texts),
        padding="max_length",
        max_length=max_length,
        truncation=True,
        return_tensors="pt",
        **extra,
    ).input_ids


def clip_states(encoder: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden[N, 77, D], pooled[N, P])`` of token ids: penultimate hidden states and the
    projected pooled output."""
    out = encoder(ids.to(module_device(encoder)), output_hidden_states=True)
    return out.hidden_states[-2], out[0]


def t5_embeds(
    tokenizer: PreTrainedTokenizerBase,
    encoder: torch.nn.Module,
    texts: Sequence[str],
    max_sequence_length: int,
) -> torch.Tensor:
    """``hidden[N, max_sequence_length, D_t5]``: T5 encoder last hidden state."""
    warn_truncated_prompts(
        tokenizer, list(texts), max_sequence_length, "bundle.max_sequence_length"
    )
    ids = _token_ids(tokenizer, texts, max_sequence_length, add_special_tokens=True)
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


def sd3_token_ids(
    stack: SD3TextStack, texts: Sequence[str], max_sequence_length: int
) -> tuple[torch.Tensor, ...]:
    """``(ids_l, ids_g[, ids_t5])``: the tokens each encoder of ``stack`` reads."""
    ids = (
        _token_ids(stack.tokenizer, texts, stack.clip_max_length),
        _token_ids(stack.tokenizer_2, texts, stack.clip_max_length),
    )
    if stack.text_encoder_3 is None:
        return ids
    warn_truncated_prompts(
        stack.tokenizer_3, list(texts), max_sequence_length, "bundle.max_sequence_length"
    )
    return (
        *ids,
        _token_ids(stack.tokenizer_3, texts, max_sequence_length, add_special_tokens=True),
    )


def sd3_encoder_states(stack: SD3TextStack, *ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(clip[N, 77, D_l + D_g], pooled[N, P_l + P_g][, t5[N, L, D_t5]])`` of
    :func:`sd3_token_ids`' tensors: the encoder forwards only (no host work, so one CUDA graph
    can replay them)."""
    hidden_l, pooled_l = clip_states(stack.text_encoder, ids[0])
    hidden_g, pooled_g = clip_states(stack.text_encoder_2, ids[1])
    clip_dtype = module_dtype(stack.text_encoder)
    clip = torch.cat([hidden_l.to(clip_dtype), hidden_g.to(clip_dtype)], dim=-1)
    pooled = torch.cat([pooled_l, pooled_g], dim=-1)
    if stack.text_encoder_3 is None:
        return clip, pooled
    t5 = stack.text_encoder_3(ids[2].to(module_device(stack.text_encoder_3)))[0]
    return clip, pooled, t5.to(module_dtype(stack.text_encoder_3))


@torch.no_grad()
def encode_sd3_prompts(
    stack: SD3TextStack,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
    t5_placeholder: str = "zeros",
    encoders: Callable[..., tuple[torch.Tensor, ...]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_embeds[N, 77 + L, D_t5], pooled[N, D_l + D_g])`` for ``texts``, one row each.

    Dtypes follow diffusers: CLIP states in CLIP-L's dtype, T5 states in T5's dtype.
    ``encoders``: what runs :func:`sd3_encoder_states` on the token ids (a
    :class:`~unirl.models.common.cuda_graph.GraphedFunction` of it; default: eagerly).
    """
    if not texts:
        raise ValueError("encode_sd3_prompts: no texts to encode")
    ids = sd3_token_ids(stack, texts, max_sequence_length)
    states = encoders(*ids) if encoders is not None else sd3_encoder_states(stack, *ids)
    clip, pooled = states[0], states[1]
    if stack.text_encoder_3 is not None:
        t5 = states[2]
    else:
        t5 = t5_placeholder_embeds(
            texts,
            length=max_sequence_length,
            width=stack.joint_attention_dim,
            kind=t5_placeholder,
            dtype=clip.dtype,
            device=clip.device,
        )
    if clip.shape[-1] > t5.shape[-1]:
        raise ValueError(
            f"CLIP width {clip.shape[-1]} exceeds the T5 width {t5.shape[-1]}; SD3 pads CLIP up to T5"
        )
    clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
    prompt_embeds = torch.cat([clip, t5.to(clip.device)], dim=-2)
    return prompt_embeds, pooled
