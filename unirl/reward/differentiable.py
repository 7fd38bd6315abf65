"""Differentiable rewards for reward-gradient training (ReFL, DRaFT, AlignProp, DR-Tune).

A differentiable reward is a callable ``reward(pixels) -> rewards[N]`` on decoded
``pixels[N, 3, H, W]`` (float, [0, 1], as every bundle's ``decode`` returns them) whose value
equals the matching ``RewardBackend``'s score and whose gradient reaches the pixels: the loss
nodes of ``unirl.algorithms.reward_gradient`` call it inside the autograd graph of the decode.
The model scorers' preprocessing (``local._hf.ImagePreprocess``: resize, crop, normalise) is
torch already; they score under ``torch.no_grad`` and need prompts, which the loss nodes are
not handed yet, so only the pixel rewards have a differentiable form so far.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from unirl.config.require import require


@dataclass(kw_only=True)
class DifferentiableBrightness:
    """``−|mean(pixels) − target|`` per image (mean over C·H·W), the value of
    ``unirl.reward.local.BrightnessTarget``; differentiable in the pixels (the gradient of
    each pixel is −sign(mean − target)/(C·H·W), 0 at the target). ``target``: the brightness
    aimed at, in [0, 1]."""

    target: float = 0.8

    def __post_init__(self) -> None:
        require(0.0 <= self.target <= 1.0, "DifferentiableBrightness.target must be in [0, 1]")

    def __call__(self, pixels: Tensor) -> Tensor:
        if pixels.ndim != 4:
            raise ValueError(
                f"DifferentiableBrightness takes pixels[N, C, H, W], got shape {tuple(pixels.shape)}"
            )
        return -(pixels.float().mean(dim=(1, 2, 3)) - self.target).abs()
