"""``SD3Conditions``: encoded prompts of one batch, per sample (concat on dim 0)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types import Conditions, batch_field


@dataclass(kw_only=True)
class SD3Conditions(Conditions):
    """``prompt_embeds[N, 77 + L_t5, D_t5]`` (CLIP-L ‖ CLIP-G padded to the T5 width, then T5)
    and ``pooled_prompt_embeds[N, D_l + D_g]``; the optional ``negative_*`` fields hold the
    matching negative-prompt encodings for classifier-free guidance (same shapes)."""

    prompt_embeds: torch.Tensor = batch_field("concat")
    pooled_prompt_embeds: torch.Tensor = batch_field("concat")
    negative_prompt_embeds: torch.Tensor | None = batch_field("concat", default=None)
    negative_pooled_prompt_embeds: torch.Tensor | None = batch_field("concat", default=None)

    def __post_init__(self) -> None:
        n = self.prompt_embeds.shape[0]
        if self.prompt_embeds.ndim != 3 or self.pooled_prompt_embeds.ndim != 2:
            raise ValueError(
                "SD3Conditions: prompt_embeds must be [N, L, D] and pooled_prompt_embeds [N, Dp], got "
                f"{tuple(self.prompt_embeds.shape)} and {tuple(self.pooled_prompt_embeds.shape)}"
            )
        if self.pooled_prompt_embeds.shape[0] != n:
            raise ValueError(
                f"SD3Conditions: {n} prompt_embeds rows but {self.pooled_prompt_embeds.shape[0]} pooled rows"
            )
        if (self.negative_prompt_embeds is None) != (self.negative_pooled_prompt_embeds is None):
            raise ValueError(
                "SD3Conditions: set both negative_prompt_embeds and negative_pooled_prompt_embeds, or neither"
            )
        if (
            self.negative_prompt_embeds is not None
            and self.negative_pooled_prompt_embeds is not None
            and (
                self.negative_prompt_embeds.shape != self.prompt_embeds.shape
                or self.negative_pooled_prompt_embeds.shape != self.pooled_prompt_embeds.shape
            )
        ):
            raise ValueError(
                "SD3Conditions: negative embeddings must match the positive shapes, got "
                f"{tuple(self.negative_prompt_embeds.shape)} vs {tuple(self.prompt_embeds.shape)} and "
                f"{tuple(self.negative_pooled_prompt_embeds.shape)} vs {tuple(self.pooled_prompt_embeds.shape)}"
            )

    @property
    def has_negative(self) -> bool:
        return self.negative_prompt_embeds is not None

    def positive(self) -> SD3Conditions:
        """The prompt rows only (negatives dropped)."""
        return SD3Conditions(
            prompt_embeds=self.prompt_embeds, pooled_prompt_embeds=self.pooled_prompt_embeds
        )

    def negative(self) -> SD3Conditions:
        """The negative rows as plain conditions; raises ``ValueError`` if there are none."""
        if self.negative_prompt_embeds is None or self.negative_pooled_prompt_embeds is None:
            raise ValueError(
                "SD3Conditions.negative: no negative embeddings (encode with negative=True)"
            )
        return SD3Conditions(
            prompt_embeds=self.negative_prompt_embeds,
            pooled_prompt_embeds=self.negative_pooled_prompt_embeds,
        )

    def cfg_pairs(self) -> SD3Conditions:
        """``[negative rows; prompt rows]`` (2·N rows) for one batched CFG forward, as diffusers orders them."""
        neg = self.negative()
        return SD3Conditions(
            prompt_embeds=torch.cat([neg.prompt_embeds, self.prompt_embeds]),
            pooled_prompt_embeds=torch.cat([neg.pooled_prompt_embeds, self.pooled_prompt_embeds]),
        )
