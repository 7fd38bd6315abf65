"""HunyuanVideo 1.0 prompt encoding, computed as ``HunyuanVideoPipeline.encode_prompt`` computes
it.

Two encoders read each prompt:

- the Llama text encoder: the prompt is put into the pipeline's template (a system turn that
  asks for a description of the video, then the prompt as the user turn), tokenised with
  padding and truncation to exactly ``crop_start + max_sequence_length`` tokens, and the
  third-to-last hidden state is read; its first ``crop_start`` positions (the system turn
  and the user header) are dropped: ``prompt_embeds[N, max_sequence_length, D]`` with its
  0/1 mask. Positions past the prompt keep the encoder's values; the transformer masks
  them out;
- CLIP's text model: the prompt tokenised to 77 tokens, its pooled output
  ``pooled[N, D2]`` (the transformer's pooled projection input, beside the timestep and
  guidance embeddings).

The template, the crop and the hidden layer are read from diffusers' pipeline itself (its
``DEFAULT_PROMPT_TEMPLATE`` and its encoding methods' defaults), so a diffusers update that
changes them is followed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from unirl.models.common.text_encode import warn_long_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class PromptTemplate:
    """What the pipeline wraps and crops: the template (``{}`` is the prompt), the number of
    leading tokens dropped, the hidden layer read (``hidden_states[-(skip + 1)]``), the
    default Llama length and CLIP's length."""

    template: str
    crop_start: int
    hidden_layers_to_skip: int
    max_sequence_length: int
    clip_max_length: int


@functools.cache
def pipeline_prompt_template() -> PromptTemplate:
    """The template of diffusers' ``HunyuanVideoPipeline`` (read from the module and its
    encoding methods' defaults)."""
    from diffusers import HunyuanVideoPipeline
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    llama = inspect.signature(HunyuanVideoPipeline._get_llama_prompt_embeds).parameters
    clip = inspect.signature(HunyuanVideoPipeline._get_clip_prompt_embeds).parameters
    return PromptTemplate(
        template=str(DEFAULT_PROMPT_TEMPLATE["template"]),
        crop_start=int(DEFAULT_PROMPT_TEMPLATE["crop_start"]),
        hidden_layers_to_skip=int(llama["num_hidden_layers_to_skip"].default),
        max_sequence_length=int(llama["max_sequence_length"].default),
        clip_max_length=int(clip["max_sequence_length"].default),
    )


def _device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _dtype_of(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


@torch.no_grad()
def encode_llama_prompts(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
    template: PromptTemplate | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_embeds[N, L, D], mask[N, L])`` with ``L = max_sequence_length``: the text
    encoder's third-to-last hidden state after the template's first ``crop_start`` tokens
    (embeddings in its dtype, mask long)."""
    if not texts:
        raise ValueError("encode_llama_prompts: no texts to encode")
    template = template or pipeline_prompt_template()
    wrapped = [template.template.format(t) for t in texts]
    # the tokens after the template's first crop_start are what max_sequence_length counts
    warn_long_prompts(
        [len(row) - template.crop_start for row in tokenizer(wrapped).input_ids],
        list(texts),
        max_sequence_length,
        "bundle.max_sequence_length",
    )
    tokens = tokenizer(
        wrapped,
        max_length=max_sequence_length + template.crop_start,
        padding="max_length",
        truncation=True,
        return_tensors="pt",
        return_attention_mask=True,
    )
    device = _device_of(text_encoder)
    mask = tokens.attention_mask.to(device)
    hidden = text_encoder(
        input_ids=tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=True
    ).hidden_states[-(template.hidden_layers_to_skip + 1)]
    crop = template.crop_start
    return hidden[:, crop:].to(_dtype_of(text_encoder)), mask[:, crop:].long()


@torch.no_grad()
def encode_clip_pooled(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_length: int = 77,
) -> torch.Tensor:
    """``pooled[N, D2]``: CLIP's pooled output of each prompt (77 tokens, padded, cut)."""
    if not texts:
        raise ValueError("encode_clip_pooled: no texts to encode")
    tokens = tokenizer(
        list(texts),
        padding="max_length",
        max_length=max_length,
        truncation=True,
        return_tensors="pt",
    )
    out = text_encoder(tokens.input_ids.to(_device_of(text_encoder)), output_hidden_states=False)
    return out.pooler_output.to(_dtype_of(text_encoder))
