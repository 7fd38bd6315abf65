"""Z-Image prompt encoding, computed as ``ZImagePipeline.encode_prompt`` computes it.

Each prompt becomes one user turn of the tokenizer's chat template with the generation
prompt open and thinking enabled (``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>
assistant\\n`` with Qwen3's template), is tokenised padded to ``max_sequence_length`` (and cut
there), and runs through the Qwen3 text encoder with the attention mask. The caption is the
*second-to-last* hidden state of the real tokens: nothing of the template is dropped, and
every prompt keeps its own length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from unirl.models.common.text_encode import module_device, user_turn, warn_truncated_prompts
from unirl.types import Packed

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@torch.no_grad()
def encode_z_image_prompts(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: torch.nn.Module,
    texts: Sequence[str],
    *,
    max_sequence_length: int,
) -> Packed:
    """Captions of ``texts``, one row each: ``Packed`` values ``[sum L_i, D]`` in the text
    encoder's dtype on its device (offsets on the host), ``L_i`` the real tokens of text
    ``i`` (at most ``max_sequence_length``)."""
    if not texts:
        raise ValueError("encode_z_image_prompts: no texts to encode")
    turns = [user_turn(tokenizer, t, enable_thinking=True) for t in texts]
    warn_truncated_prompts(tokenizer, turns, max_sequence_length, "bundle.max_sequence_length")
    tokens = tokenizer(
        turns,
        padding="max_length",
        max_length=max_sequence_length,
        truncation=True,
        return_tensors="pt",
    )
    device = module_device(text_encoder)
    input_ids = tokens.input_ids.to(device)
    mask = tokens.attention_mask.to(device).bool()
    hidden = text_encoder(
        input_ids=input_ids, attention_mask=mask, output_hidden_states=True
    ).hidden_states[-2]
    lengths = tokens.attention_mask.sum(dim=1)  # host copy: no device read
    offsets = torch.zeros(len(texts) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    return Packed(values=hidden[mask], offsets=offsets)
