"""``WanConditions``: encoded prompts (and, for I2V, the first frame) of one batch, per sample."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from unirl.types import Conditions, batch_field


@dataclass(kw_only=True)
class WanConditions(Conditions):
    """``prompt_embeds[N, L, D]`` (UMT5 hidden states, zero past each prompt's tokens, ``L`` the
    bundle's ``max_sequence_length``) and the optional ``negative_prompt_embeds`` of the same
    shape for classifier-free guidance.

    Image-to-video rows add ``image_condition[N, 4 + C, F, h, w]`` (first-frame mask and VAE
    latent, concatenated to the noisy latent along channels) and, for models with a CLIP
    image encoder (Wan 2.1 I2V), ``image_embeds[N, S, D_img]``. Both condition the
    unconditional branch too, as in ``WanImageToVideoPipeline``. ``video_shape``
    (``num_frames, height, width``, shared) is stamped by ``WanPipeline`` so the first frames
    can be encoded for the request's length.
    """

    prompt_embeds: torch.Tensor = batch_field("concat")
    negative_prompt_embeds: torch.Tensor | None = batch_field("concat", default=None)
    image_condition: torch.Tensor | None = batch_field("concat", default=None)
    image_embeds: torch.Tensor | None = batch_field("concat", default=None)
    # (num_frames, height, width) of the request the rows were encoded for (I2V needs it)
    video_shape: tuple[int, int, int] | None = batch_field("shared", default=None)

    def __post_init__(self) -> None:
        if self.prompt_embeds.ndim != 3:
            raise ValueError(
                "WanConditions: prompt_embeds must be [N, L, D], got "
                f"{tuple(self.prompt_embeds.shape)}"
            )
        n = self.prompt_embeds.shape[0]
        neg = self.negative_prompt_embeds
        if neg is not None and neg.shape != self.prompt_embeds.shape:
            raise ValueError(
                "WanConditions: negative_prompt_embeds must match prompt_embeds, got "
                f"{tuple(neg.shape)} vs {tuple(self.prompt_embeds.shape)}"
            )
        for name, value, ndim in (
            ("image_condition", self.image_condition, 5),
            ("image_embeds", self.image_embeds, 3),
        ):
            if value is not None and (value.ndim != ndim or value.shape[0] != n):
                raise ValueError(
                    f"WanConditions: {name} must have {ndim} dims and {n} rows, got "
                    f"{tuple(value.shape)}"
                )

    @property
    def has_negative(self) -> bool:
        return self.negative_prompt_embeds is not None

    def positive(self) -> WanConditions:
        """The prompt rows (with their image conditioning), negatives dropped."""
        return WanConditions(
            prompt_embeds=self.prompt_embeds,
            image_condition=self.image_condition,
            image_embeds=self.image_embeds,
            video_shape=self.video_shape,
        )

    def negative(self) -> WanConditions:
        """The negative rows (with the same image conditioning); raises ``ValueError`` if there
        are none."""
        if self.negative_prompt_embeds is None:
            raise ValueError(
                "WanConditions.negative: no negative embeddings (encode with negative=True)"
            )
        return WanConditions(
            prompt_embeds=self.negative_prompt_embeds,
            image_condition=self.image_condition,
            image_embeds=self.image_embeds,
            video_shape=self.video_shape,
        )

    def with_video_shape(self, num_frames: int, height: int, width: int) -> WanConditions:
        """These rows stamped with the request's video shape."""
        return dataclasses.replace(self, video_shape=(int(num_frames), int(height), int(width)))

    def with_images(
        self, image_condition: torch.Tensor, image_embeds: torch.Tensor | None
    ) -> WanConditions:
        """These rows with image-to-video conditioning attached (one first frame per row)."""
        return WanConditions(
            prompt_embeds=self.prompt_embeds,
            negative_prompt_embeds=self.negative_prompt_embeds,
            image_condition=image_condition,
            image_embeds=image_embeds,
            video_shape=self.video_shape,
        )

    def cfg_pairs(self) -> WanConditions:
        """``[negative rows; prompt rows]`` (2·N rows) for one batched CFG forward."""
        neg, pos = self.negative(), self.positive()

        def both(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
            return None if a is None or b is None else torch.cat([a, b])

        return WanConditions(
            prompt_embeds=torch.cat([neg.prompt_embeds, pos.prompt_embeds]),
            image_condition=both(neg.image_condition, pos.image_condition),
            image_embeds=both(neg.image_embeds, pos.image_embeds),
            video_shape=self.video_shape,
        )
