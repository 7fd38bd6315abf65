"""``HunyuanVideo15Conditions``: the encoded prompts of one batch, per sample."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types import Conditions, batch_field


@dataclass(kw_only=True)
class HunyuanVideo15Conditions(Conditions):
    """Both encoders' rows and their masks, for the prompts and (for classifier-free guidance)
    the negative prompt:

    - ``prompt_embeds[N, L, D]`` / ``prompt_mask[N, L]``: the Qwen2.5-VL hidden states after the
      chat template, ``L`` the bundle's ``max_sequence_length`` (mask long, 1 on the prompt's
      tokens);
    - ``glyph_embeds[N, G, D2]`` / ``glyph_mask[N, G]``: the ByT5 encoding of the quoted texts,
      ``G`` the bundle's ``glyph_max_sequence_length`` (all zero without quoted text).

    Every row has the same ``L`` and ``G``, so prompt and negative rows stack into one
    batched CFG forward.
    """

    prompt_embeds: torch.Tensor = batch_field("concat")
    prompt_mask: torch.Tensor = batch_field("concat")
    glyph_embeds: torch.Tensor = batch_field("concat")
    glyph_mask: torch.Tensor = batch_field("concat")
    negative_prompt_embeds: torch.Tensor | None = batch_field("concat", default=None)
    negative_prompt_mask: torch.Tensor | None = batch_field("concat", default=None)
    negative_glyph_embeds: torch.Tensor | None = batch_field("concat", default=None)
    negative_glyph_mask: torch.Tensor | None = batch_field("concat", default=None)

    def __post_init__(self) -> None:
        n = self.prompt_embeds.shape[0]
        for name, embeds, mask in (
            ("prompt", self.prompt_embeds, self.prompt_mask),
            ("glyph", self.glyph_embeds, self.glyph_mask),
        ):
            if embeds.ndim != 3 or embeds.shape[0] != n:
                raise ValueError(
                    f"HunyuanVideo15Conditions: {name}_embeds must be [{n}, length, dim], got "
                    f"{tuple(embeds.shape)}"
                )
            if tuple(mask.shape) != tuple(embeds.shape[:2]):
                raise ValueError(
                    f"HunyuanVideo15Conditions: {name}_mask must be {tuple(embeds.shape[:2])}, "
                    f"got {tuple(mask.shape)}"
                )
        negatives = (
            self.negative_prompt_embeds,
            self.negative_prompt_mask,
            self.negative_glyph_embeds,
            self.negative_glyph_mask,
        )
        given = [v is not None for v in negatives]
        if any(given) and not all(given):
            raise ValueError(
                "HunyuanVideo15Conditions: give all four negative tensors (embeddings and masks "
                "of both encoders) or none"
            )
        if all(given):
            for name, neg, pos in (
                ("negative_prompt_embeds", self.negative_prompt_embeds, self.prompt_embeds),
                ("negative_glyph_embeds", self.negative_glyph_embeds, self.glyph_embeds),
            ):
                assert neg is not None
                if neg.shape != pos.shape:
                    raise ValueError(
                        f"HunyuanVideo15Conditions: {name} must match the prompt rows, got "
                        f"{tuple(neg.shape)} vs {tuple(pos.shape)}"
                    )

    @property
    def has_negative(self) -> bool:
        return self.negative_prompt_embeds is not None

    def positive(self) -> HunyuanVideo15Conditions:
        """The prompt rows, negatives dropped."""
        return HunyuanVideo15Conditions(
            prompt_embeds=self.prompt_embeds,
            prompt_mask=self.prompt_mask,
            glyph_embeds=self.glyph_embeds,
            glyph_mask=self.glyph_mask,
        )

    def negative(self) -> HunyuanVideo15Conditions:
        """The negative rows; raises ``ValueError`` if there are none."""
        if not self.has_negative:
            raise ValueError(
                "HunyuanVideo15Conditions.negative: no negative rows (encode with negative=True)"
            )
        assert self.negative_prompt_embeds is not None and self.negative_prompt_mask is not None
        assert self.negative_glyph_embeds is not None and self.negative_glyph_mask is not None
        return HunyuanVideo15Conditions(
            prompt_embeds=self.negative_prompt_embeds,
            prompt_mask=self.negative_prompt_mask,
            glyph_embeds=self.negative_glyph_embeds,
            glyph_mask=self.negative_glyph_mask,
        )

    def with_negative(self, negative: HunyuanVideo15Conditions) -> HunyuanVideo15Conditions:
        """These rows with the one-row ``negative`` attached to every row."""
        if len(negative) != 1:
            raise ValueError(f"with_negative takes one negative row, got {len(negative)}")
        n = len(self)

        def rows(t: torch.Tensor) -> torch.Tensor:
            return t.expand(n, *t.shape[1:])

        return HunyuanVideo15Conditions(
            prompt_embeds=self.prompt_embeds,
            prompt_mask=self.prompt_mask,
            glyph_embeds=self.glyph_embeds,
            glyph_mask=self.glyph_mask,
            negative_prompt_embeds=rows(negative.prompt_embeds),
            negative_prompt_mask=rows(negative.prompt_mask),
            negative_glyph_embeds=rows(negative.glyph_embeds),
            negative_glyph_mask=rows(negative.glyph_mask),
        )

    def cfg_pairs(self) -> HunyuanVideo15Conditions:
        """``[negative rows; prompt rows]`` (2·N rows) for one batched CFG forward."""
        neg, pos = self.negative(), self.positive()
        return HunyuanVideo15Conditions(
            prompt_embeds=torch.cat([neg.prompt_embeds, pos.prompt_embeds]),
            prompt_mask=torch.cat([neg.prompt_mask, pos.prompt_mask]),
            glyph_embeds=torch.cat([neg.glyph_embeds, pos.glyph_embeds]),
            glyph_mask=torch.cat([neg.glyph_mask, pos.glyph_mask]),
        )
