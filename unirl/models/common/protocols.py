"""What a flow-matching model family supplies to the shared denoise loop and the driver."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.types import Conditions


@runtime_checkable
class FlowMatchingFamily(Protocol):
    """A family: its σ policy, guidance, encode, velocity, latent geometry and decode.

    The denoise loop, SDE kernels, log-prob recording and replay are written once in
    :mod:`unirl.models.common.denoise` and used by every family; a family bundle
    (:class:`unirl.models.common.bundle.FlowMatchingBundle`) supplies the rest.

    - σ policy: ``scheduler_config`` (the diffusers scheduler config, plus ``sigma_spacing``
      where the family's diffusers pipeline passes its own pre-shift σ) and
      ``image_seq_len(height, width)`` for resolution-dependent (dynamic) shifts, both read
      by ``unirl.sde.sigmas_from_scheduler_config``;
    - ``guidance``: a :class:`unirl.models.common.guidance.Guidance` (batched CFG by
      default, separate norm-rescaled forwards for Qwen-Image, none for distilled models);
    - ``latent_shape(height, width)``: the per-sample latent the loop carries (a video
      family adds ``num_frames``); ``decode`` maps it to pixels.
    """

    scheduler_config: ConfigDict

    def encode_prompts(self, texts: list[str], *, negative: bool = False) -> Conditions:
        """Encoded conditions for ``texts`` (one row per text)."""
        ...

    def cfg_conditions(self, conditions: Conditions) -> Conditions:
        """Conditions for one batched CFG forward: ``[uncond rows; cond rows]`` (2·N rows)."""
        ...

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        """``v`` with the shape of ``latents[B, ...]`` at ``sigma[B]``."""
        ...

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """The per-sample latent shape for an image of ``height x width`` pixels."""
        ...

    def image_seq_len(self, height: int, width: int) -> int:
        """Image tokens the transformer sees (drives dynamic σ shifts)."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` (or ``[B, T, 3, H, W]`` for video) float32 in [0, 1]."""
        ...
