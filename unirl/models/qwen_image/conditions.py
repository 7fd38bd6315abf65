"""``QwenImageConditions``: encoded prompts of one batch, per sample (concat on dim 0)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import torch

from unirl.types import Conditions, batch_field


def _pad_to(
    embeds: torch.Tensor, mask: torch.Tensor | None, length: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-pad ``embeds[N, L, D]`` with zeros (and ``mask[N, L]`` with 0) to ``length``."""
    extra = length - embeds.shape[1]
    if extra == 0:
        return embeds, mask
    if mask is None:
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    return (
        torch.nn.functional.pad(embeds, (0, 0, 0, extra)),
        torch.nn.functional.pad(mask, (0, extra)),
    )


def _all_valid(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``None`` when every token is valid (what diffusers passes then), else ``mask``."""
    return None if mask is None or bool(mask.all()) else mask


@dataclass(kw_only=True)
class QwenImageConditions(Conditions):
    """``prompt_embeds[N, L, D]`` (Qwen2.5-VL last hidden states after the template prefix,
    zero-padded to the longest prompt of the batch) with ``prompt_mask[N, L]`` (1 = token,
    0 = padding; None = all tokens); the optional ``negative_*`` fields hold the negative
    prompt's encoding, of its own length ``L'`` (true CFG runs it in a separate forward).

    Rows of batches with different lengths concatenate by right-padding to the longest.
    """

    prompt_embeds: torch.Tensor = batch_field("concat")
    prompt_mask: torch.Tensor | None = batch_field("concat", default=None)
    negative_prompt_embeds: torch.Tensor | None = batch_field("concat", default=None)
    negative_prompt_mask: torch.Tensor | None = batch_field("concat", default=None)

    def __post_init__(self) -> None:
        if self.prompt_embeds.ndim != 3:
            raise ValueError(
                "QwenImageConditions: prompt_embeds must be [N, L, D], got "
                f"{tuple(self.prompt_embeds.shape)}"
            )
        pairs = [("prompt", self.prompt_embeds, self.prompt_mask)]
        if self.negative_prompt_embeds is not None:
            pairs.append(
                ("negative_prompt", self.negative_prompt_embeds, self.negative_prompt_mask)
            )
            if self.negative_prompt_embeds.shape[::2] != self.prompt_embeds.shape[::2]:
                raise ValueError(
                    "QwenImageConditions: negative_prompt_embeds must have the rows and width of "
                    f"prompt_embeds, got {tuple(self.negative_prompt_embeds.shape)} vs "
                    f"{tuple(self.prompt_embeds.shape)}"
                )
        elif self.negative_prompt_mask is not None:
            raise ValueError(
                "QwenImageConditions: negative_prompt_mask without negative_prompt_embeds"
            )
        for name, embeds, mask in pairs:
            if mask is not None and tuple(mask.shape) != tuple(embeds.shape[:2]):
                raise ValueError(
                    f"QwenImageConditions: {name}_mask must be [N, L] = {tuple(embeds.shape[:2])}, "
                    f"got {tuple(mask.shape)}"
                )

    @property
    def has_negative(self) -> bool:
        return self.negative_prompt_embeds is not None

    def positive(self) -> QwenImageConditions:
        """The prompt rows only, ready for a forward (an all-valid mask becomes None)."""
        return QwenImageConditions(
            prompt_embeds=self.prompt_embeds, prompt_mask=_all_valid(self.prompt_mask)
        )

    def negative(self) -> QwenImageConditions:
        """The negative rows as plain conditions; raises ``ValueError`` if there are none."""
        if self.negative_prompt_embeds is None:
            raise ValueError(
                "QwenImageConditions.negative: no negative embeddings (encode with negative=True)"
            )
        return QwenImageConditions(
            prompt_embeds=self.negative_prompt_embeds,
            prompt_mask=_all_valid(self.negative_prompt_mask),
        )

    @classmethod
    def concat(cls, batches: Sequence[Self]) -> Self:
        """Rows of every batch, text padded to the longest prompt (and negative) first."""
        if len(batches) > 1:
            longest = max(b.prompt_embeds.shape[1] for b in batches)
            negatives = [b.negative_prompt_embeds for b in batches]
            longest_neg = max((n.shape[1] for n in negatives if n is not None), default=0)
            padded = []
            for b in batches:
                embeds, mask = _pad_to(b.prompt_embeds, b.prompt_mask, longest)
                neg, neg_mask = b.negative_prompt_embeds, b.negative_prompt_mask
                if neg is not None:
                    neg, neg_mask = _pad_to(neg, neg_mask, longest_neg)
                padded.append(
                    cls(
                        prompt_embeds=embeds,
                        prompt_mask=mask,
                        negative_prompt_embeds=neg,
                        negative_prompt_mask=neg_mask,
                    )
                )
            if any(p.prompt_mask is not None or p.negative_prompt_mask is not None for p in padded):
                padded = [p._with_masks() for p in padded]
            batches = padded
        return super().concat(batches)

    def _with_masks(self) -> Self:
        """Explicit all-ones masks where a field is None (so parts concatenate)."""

        def ones(embeds: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor | None:
            if embeds is None or mask is not None:
                return mask
            return torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)

        return type(self)(
            prompt_embeds=self.prompt_embeds,
            prompt_mask=ones(self.prompt_embeds, self.prompt_mask),
            negative_prompt_embeds=self.negative_prompt_embeds,
            negative_prompt_mask=ones(self.negative_prompt_embeds, self.negative_prompt_mask),
        )
