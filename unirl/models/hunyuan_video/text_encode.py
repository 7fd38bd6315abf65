"""HunyuanVideo 1.5 prompt encoding, computed as ``HunyuanVideo15Pipeline.encode_prompt`` computes
it.

Two encoders read each prompt:

- the multimodal LLM (Qwen2.5-VL's text model): the prompt becomes the user turn of a chat
  with the pipeline's system message (an empty prompt becomes ``" "``), the assistant header
  is appended, and the chat is tokenised with padding and truncation to exactly
  ``crop_start + max_sequence_length`` tokens. The third-to-last hidden state is read and its
  first ``crop_start`` positions (the system turn and the user header) are dropped:
  ``prompt_embeds[N, max_sequence_length, D]`` with its 0/1 mask. Positions past the prompt
  keep the encoder's values; the transformer masks them out and zeroes them;
- the glyph encoder (ByT5): the texts in quotes (``"..."`` or ``“...”``) become
  ``Text "a". Text "b". `` (diffusers' own ``extract_glyph_texts``), tokenised to exactly
  ``glyph_max_sequence_length`` bytes and encoded one prompt at a time; a prompt without
  quoted text has zero embeddings and an all-zero mask.

The system message and the crop come from diffusers' pipeline itself (the defaults of its
encoding method, which its constructor uses too), so the encoding follows the reference.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.text_encode import warn_long_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class PromptTemplate:
    """What the pipeline wraps and crops: the system message, the number of leading chat
    tokens dropped, the hidden layer read (``hidden_states[-(skip + 1)]``), and the default
    token counts of the two encoders."""

    system_message: str
    crop_start: int
    hidden_layers_to_skip: int
    max_sequence_length: int
    glyph_max_sequence_length: int


@functools.cache
def pipeline_prompt_template() -> PromptTemplate:
    """The template of diffusers' ``HunyuanVideo15Pipeline`` (read from its encoding methods'
    defaults, so a diffusers update that changes them is followed, never stale)."""
    from diffusers import HunyuanVideo15Pipeline

    mllm = inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters
    glyph = inspect.signature(HunyuanVideo15Pipeline._get_byt5_prompt_embeds).parameters
    return PromptTemplate(
        system_message=str(mllm["system_message"].default),
        crop_start=int(mllm["crop_start"].default),
        hidden_layers_to_skip=int(mllm["num_hidden_layers_to_skip"].default),
        max_sequence_length=int(mllm["tokenizer_max_length"].default),
        glyph_max_sequence_length=int(glyph["tokenizer_max_length"].default),
    )


def _device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _dtype_of(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def chat_messages(prompt: str, system_message: str) -> list[dict[str, str]]:
    """One conversation: the system message and the prompt as the user turn (``" "`` for an
    empty prompt, as the pipeline does)."""
    return [
        {"role": "system", "content": system_message},
        {"role": "user", "content": prompt if prompt else " "},
    ]


@torch.no_grad()
def encode_mllm_prompts(
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
        raise ValueError("encode_mllm_prompts: no texts to encode")
    template = template or pipeline_prompt_template()
    chats = [chat_messages(t, template.system_message) for t in texts]
    # the tokens after the template's first crop_start are what max_sequence_length counts
    full: Any = tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True)
    ids = full["input_ids"] if isinstance(full, Mapping) else full
    warn_long_prompts(
        [len(row) - template.crop_start for row in ids],
        list(texts),
        max_sequence_length,
        "bundle.max_sequence_length",
    )
    tokens = tokenizer.apply_chat_template(
        chats,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        padding="max_length",
        max_length=max_sequence_length + template.crop_start,
        truncation=True,
        return_tensors="pt",
    )
    from transformers import BatchEncoding

    if not isinstance(tokens, BatchEncoding):
        raise TypeError(
            f"apply_chat_template(return_dict=True) returned {type(tokens).__name__}, "
            "not a BatchEncoding; the tokenizer's transformers version is not supported"
        )
    device = _device_of(text_encoder)
    mask = tokens["attention_mask"].to(device)
    hidden = text_encoder(
        input_ids=tokens["input_ids"].to(device), attention_mask=mask, output_hidden_states=True
    ).hidden_states[-(template.hidden_layers_to_skip + 1)]
    crop = template.crop_start
    return hidden[:, crop:].to(_dtype_of(text_encoder)), mask[:, crop:].long()


def glyph_text(prompt: str) -> str | None:
    """The quoted texts of ``prompt`` as the glyph encoder reads them (``Text "OPEN". ``), None
    when there are none (diffusers' ``extract_glyph_texts``)."""
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import (
        extract_glyph_texts,
    )

    glyphs: Any = extract_glyph_texts(prompt)  # annotated list[str] there, returns str | None
    return None if glyphs is None else str(glyphs)


@torch.no_grad()
def encode_glyph_prompts(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(glyph_embeds[N, G, D2], mask[N, G])`` with ``G = max_sequence_length``: the ByT5
    encoding of each prompt's quoted texts (zeros and an all-zero mask without any), one
    prompt per forward as the pipeline runs them."""
    if not texts:
        raise ValueError("encode_glyph_prompts: no texts to encode")
    device, dtype = _device_of(text_encoder), _dtype_of(text_encoder)
    width = int(getattr(text_encoder, "config").d_model)  # noqa: B009
    embeds, masks = [], []
    for text in texts:
        glyphs = glyph_text(text)
        if glyphs is None:
            embeds.append(torch.zeros(1, max_sequence_length, width, device=device, dtype=dtype))
            masks.append(torch.zeros(1, max_sequence_length, dtype=torch.long, device=device))
            continue
        tokens = tokenizer(
            glyphs,
            padding="max_length",
            max_length=max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        mask = tokens.attention_mask.to(device)
        hidden = text_encoder(input_ids=tokens.input_ids.to(device), attention_mask=mask.float())[0]
        embeds.append(hidden.to(dtype))
        masks.append(mask.long())
    return torch.cat(embeds), torch.cat(masks)
