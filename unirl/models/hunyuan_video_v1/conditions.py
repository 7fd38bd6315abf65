"""``HunyuanVideoConditions``: the encoded prompts of one batch, per sample."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types import Conditions, batch_field


@dataclass(kw_only=True)
class HunyuanVideoConditions(Conditions):
    """Both encoders' outputs per sample:

    - ``prompt_embeds[N, L, D]`` / ``prompt_mask[N, L]``: the Llama hidden states after the
      template's crop, ``L`` the bundle's ``max_sequence_length`` (mask long, 1 on the
      prompt's tokens, right-padded: the transformer keeps the first ``mask.sum()``);
    - ``pooled[N, D2]``: CLIP's pooled output;
    - ``guidance[N]`` (set by :class:`~unirl.models.hunyuan_video_v1.guidance.EmbeddedGuidance`
      for the forward, None as encoded): the distilled guidance scale the transformer embeds.

    There are no negative rows: the model is guidance-distilled (one conditional forward).
    """

    prompt_embeds: torch.Tensor = batch_field("concat")
    prompt_mask: torch.Tensor = batch_field("concat")
    pooled: torch.Tensor = batch_field("concat")
    guidance: torch.Tensor | None = batch_field("concat", default=None)

    def __post_init__(self) -> None:
        n = self.prompt_embeds.shape[0]
        if self.prompt_embeds.ndim != 3:
            raise ValueError(
                "HunyuanVideoConditions: prompt_embeds must be [N, length, dim], got "
                f"{tuple(self.prompt_embeds.shape)}"
            )
        if tuple(self.prompt_mask.shape) != tuple(self.prompt_embeds.shape[:2]):
            raise ValueError(
                f"HunyuanVideoConditions: prompt_mask must be {tuple(self.prompt_embeds.shape[:2])}"
                f", got {tuple(self.prompt_mask.shape)}"
            )
        if self.pooled.ndim != 2 or self.pooled.shape[0] != n:
            raise ValueError(
                f"HunyuanVideoConditions: pooled must be [{n}, dim], got {tuple(self.pooled.shape)}"
            )
        if self.guidance is not None and tuple(self.guidance.shape) != (n,):
            raise ValueError(
                f"HunyuanVideoConditions: guidance must be [{n}], got {tuple(self.guidance.shape)}"
            )

    def with_guidance(self, scale: float) -> HunyuanVideoConditions:
        """These rows with the embedded guidance scale ``scale`` on every row (fp32)."""
        n = self.prompt_embeds.shape[0]
        return HunyuanVideoConditions(
            prompt_embeds=self.prompt_embeds,
            prompt_mask=self.prompt_mask,
            pooled=self.pooled,
            guidance=torch.full((n,), float(scale), device=self.prompt_embeds.device),
        )
