"""Qwen-Image prompt encoding, computed as ``QwenImagePipeline.encode_prompt`` computes it.

Each prompt is wrapped in the pipeline's chat template (a system instruction, the prompt as
the user turn, then the assistant header), tokenised with padding to the longest text of the
batch, and run through the Qwen2.5-VL text encoder with the attention mask. The last hidden
state of every real token is kept, the template's first ``drop_idx`` tokens (the system
turn and the user header) are dropped, the rows are zero-padded to the longest remaining one
with a 0/1 mask, and cut to ``max_sequence_length`` tokens.

The template, the drop index and the tokenizer's length cap are read from diffusers'
``QwenImagePipeline`` itself, so the encoding follows the reference pipeline exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from unirl.models.common.text_encode import module_device, module_dtype, warn_long_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class PromptTemplate:
    """The chat template a prompt is wrapped in (``{}`` marks the prompt), how many of its
    leading tokens are dropped, and the tokenizer's length cap without them."""

    text: str
    drop_idx: int
    max_length: int

    @property
    def prefix(self) -> str:
        """The part before the prompt (what ``drop_idx`` tokens cover)."""
        return self.text.split("{}", 1)[0]


@functools.cache
def pipeline_prompt_template() -> PromptTemplate:
    """The template diffusers' ``QwenImagePipeline`` encodes prompts with (read from an empty
    pipeline object, so a diffusers update that changes it is followed, never stale)."""
    from diffusers import QwenImagePipeline

    empty = QwenImagePipeline(
        scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None
    )
    # attributes set in the pipeline's __init__
    return PromptTemplate(
        text=str(getattr(empty, "prompt_template_encode")),  # noqa: B009
        drop_idx=int(getattr(empty, "prompt_template_encode_start_idx")),  # noqa: B009
        max_length=int(getattr(empty, "tokenizer_max_length")),  # noqa: B009
    )


@torch.no_grad()
def encode_qwen_prompts(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
    template: PromptTemplate | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_embeds[N, L, D], mask[N, L])`` for ``texts``, one row each (``mask`` long,
    1 for tokens, 0 for padding; ``L`` the longest prompt after the template prefix, at most
    ``max_sequence_length``). Embeddings are in the text encoder's dtype."""
    if not texts:
        raise ValueError("encode_qwen_prompts: no texts to encode")
    template = template or pipeline_prompt_template()
    wrapped = [template.text.format(t) for t in texts]
    # the tokens after the dropped prefix are what both cuts below count (the config keeps
    # max_sequence_length within the template's own limit)
    warn_long_prompts(
        [len(ids) - template.drop_idx for ids in tokenizer(wrapped).input_ids],
        list(texts),
        min(max_sequence_length, template.max_length),
        "bundle.max_sequence_length",
    )
    tokens = tokenizer(
        wrapped,
        max_length=template.max_length + template.drop_idx,
        padding=True,
        truncation=True,
        return_tensors="pt",
    )
    device = module_device(text_encoder)
    input_ids = tokens.input_ids.to(device)
    attention_mask = tokens.attention_mask.to(device)
    hidden = text_encoder(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
    ).hidden_states[-1]
    valid = attention_mask.bool()
    rows = [
        r[template.drop_idx :] for r in torch.split(hidden[valid], valid.sum(dim=1).tolist(), dim=0)
    ]
    longest = max(r.shape[0] for r in rows)
    embeds = torch.stack(
        [torch.cat([r, r.new_zeros(longest - r.shape[0], r.shape[1])]) for r in rows]
    )
    mask = torch.stack(
        [
            torch.cat(
                [
                    torch.ones(r.shape[0], dtype=torch.long, device=r.device),
                    torch.zeros(longest - r.shape[0], dtype=torch.long, device=r.device),
                ]
            )
            for r in rows
        ]
    )
    embeds = embeds.to(module_dtype(text_encoder))
    return embeds[:, :max_sequence_length], mask[:, :max_sequence_length]
