"""What a flow-matching model family supplies to the shared denoise loop."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from unirl.types import Batch, Conditions


@runtime_checkable
class FlowMatchingFamily(Protocol):
    """A family bundle: encode, velocity, latent geometry and decode — nothing else.

    The denoise loop, CFG batching, SDE kernels, log-prob recording and replay are written
    once in :mod:`unirl.models.common.denoise` and used by every family.
    """

    scheduler_config: dict[str, Any]

    def encode_prompts(self, texts: list[str], *, negative: bool = False) -> Conditions:
        """Encoded conditions for ``texts`` (one row per text)."""
        ...

    def cfg_conditions(self, conditions: Conditions) -> Conditions:
        """Conditions for one batched CFG forward: ``[uncond rows; cond rows]`` (2·N rows)."""
        ...

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditions: Batch
    ) -> torch.Tensor:
        """``v[B, C, h, w]`` for ``latents[B, C, h, w]`` at ``sigma[B]``."""
        ...

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """``(C, h, w)`` of the latent for an image of ``height x width`` pixels."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` float32 in [0, 1]."""
        ...
