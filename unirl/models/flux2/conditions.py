"""``Flux2KleinConditions``: encoded prompts (and reference images) of one batch, per sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl.types import Conditions, batch_field


@dataclass(kw_only=True)
class Flux2KleinConditions(Conditions):
    """What one FLUX.2-Klein forward reads besides the latents, one row per sample.

    - ``prompt_embeds[N, L, D]``: the Qwen3 hidden states of three layers stacked per token
      (``D = 3·hidden``), every prompt padded to the same ``L`` (``max_sequence_length``), so
      there is no mask: the transformer attends to the padding tokens too, as in diffusers.
    - ``negative_prompt_embeds[N, L, D]`` (optional): the negative prompt's, for the true CFG
      of base (undistilled) checkpoints; same shape as ``prompt_embeds``.
    - ``reference_latents[N, R, C]`` (optional, editing): the VAE latent of each row's
      reference image, patchified, normalised with the VAE's batch-norm statistics and packed
      as the generated latents are (``R`` tokens of ``C = 4·latent channels``).
    - ``reference_ids[N, R, 4]`` (with ``reference_latents``, long, kept on the host): the
      position of every reference token, ``(t=10, row, col, 0)`` — the time axis separates
      the reference from the generated image (``t=0``). The transformer reads one set of
      positions per call, so every row of a batch carries the same ids (checked here).

    A row's reference applies to both of its guidance forwards (conditional and negative).
    """

    host_fields: ClassVar[tuple[str, ...]] = ("reference_ids",)

    prompt_embeds: torch.Tensor = batch_field("concat")
    negative_prompt_embeds: torch.Tensor | None = batch_field("concat", default=None)
    reference_latents: torch.Tensor | None = batch_field("concat", default=None)
    reference_ids: torch.Tensor | None = batch_field("concat", default=None)

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.prompt_embeds.ndim != 3:
            raise ValueError(
                f"{name}: prompt_embeds must be [N, L, D], got {tuple(self.prompt_embeds.shape)}"
            )
        neg = self.negative_prompt_embeds
        if neg is not None and neg.shape != self.prompt_embeds.shape:
            raise ValueError(
                f"{name}: negative_prompt_embeds must have the shape of prompt_embeds "
                f"{tuple(self.prompt_embeds.shape)} (both padded to max_sequence_length), got "
                f"{tuple(neg.shape)}"
            )
        latents, ids = self.reference_latents, self.reference_ids
        if (latents is None) != (ids is None):
            raise ValueError(f"{name}: reference_latents and reference_ids come together")
        if latents is None or ids is None:
            return
        n = self.prompt_embeds.shape[0]
        if latents.ndim != 3 or latents.shape[0] != n:
            raise ValueError(
                f"{name}: reference_latents must be [N={n}, R, C], got {tuple(latents.shape)}"
            )
        if tuple(ids.shape) != (n, latents.shape[1], 4) or ids.is_floating_point():
            raise ValueError(
                f"{name}: reference_ids must be integer [N={n}, R={latents.shape[1]}, 4], got "
                f"{ids.dtype} {tuple(ids.shape)}"
            )
        if n > 1 and not torch.equal(ids, ids[:1].expand_as(ids)):
            raise ValueError(
                f"{name}: every row of a batch must share one reference grid (the transformer "
                "reads a single set of positions per call); resize the references of a "
                "request to one size"
            )

    @property
    def has_negative(self) -> bool:
        return self.negative_prompt_embeds is not None

    @property
    def has_references(self) -> bool:
        return self.reference_latents is not None

    def positive(self) -> Flux2KleinConditions:
        """The prompt rows (with their references), ready for a forward."""
        return Flux2KleinConditions(
            prompt_embeds=self.prompt_embeds,
            reference_latents=self.reference_latents,
            reference_ids=self.reference_ids,
        )

    def negative(self) -> Flux2KleinConditions:
        """The negative rows (with the same references); raises ``ValueError`` if there are
        none."""
        if self.negative_prompt_embeds is None:
            raise ValueError(
                "Flux2KleinConditions.negative: no negative embeddings (encode with negative=True)"
            )
        return Flux2KleinConditions(
            prompt_embeds=self.negative_prompt_embeds,
            reference_latents=self.reference_latents,
            reference_ids=self.reference_ids,
        )
