"""FLUX.2-Klein prompt encoding, computed as ``Flux2KleinPipeline.encode_prompt`` computes it.

Each prompt becomes a one-turn chat through the tokenizer's own chat template (the user turn,
then the assistant header with thinking switched off), is tokenised and padded (or cut) to
exactly ``max_sequence_length`` tokens, and the batch runs through the Qwen3 text encoder with
its attention mask. The hidden states of three layers (the pipeline's
``text_encoder_out_layers``, read from its signature so a diffusers update is followed) are
concatenated per token: ``prompt_embeds[N, L, 3·hidden]``, layer by layer. Padding tokens keep
their hidden states; the transformer takes no text mask.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from unirl.models.common.text_encode import module_device, user_turn, warn_truncated_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@functools.cache
def pipeline_text_layers() -> tuple[int, ...]:
    """The hidden-state indices ``Flux2KleinPipeline`` stacks by default (``(9, 18, 27)``:
    index 0 is the embedding output, index ``k`` the output of decoder layer ``k``)."""
    from diffusers import Flux2KleinPipeline

    default = inspect.signature(Flux2KleinPipeline.__call__).parameters["text_encoder_out_layers"]
    return tuple(int(i) for i in default.default)


@torch.no_grad()
def encode_klein_prompts(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
    layers: Sequence[int] | None = None,
) -> torch.Tensor:
    """``prompt_embeds[N, max_sequence_length, len(layers)·hidden]`` for ``texts``, in the
    text encoder's dtype, on its device."""
    if not texts:
        raise ValueError("encode_klein_prompts: no texts to encode")
    layers = tuple(pipeline_text_layers() if layers is None else layers)
    turns = [user_turn(tokenizer, t, enable_thinking=False) for t in texts]
    warn_truncated_prompts(tokenizer, turns, max_sequence_length, "bundle.max_sequence_length")
    tokens = tokenizer(
        turns,
        padding="max_length",
        truncation=True,
        max_length=max_sequence_length,
        return_tensors="pt",
    )
    device = module_device(text_encoder)
    # the decoder stack alone: the language-model head's logits are never read
    body = getattr(text_encoder, "model", text_encoder)
    hidden = body(
        input_ids=tokens.input_ids.to(device),
        attention_mask=tokens.attention_mask.to(device),
        output_hidden_states=True,
        use_cache=False,
    ).hidden_states
    return torch.cat([hidden[k] for k in layers], dim=-1)
