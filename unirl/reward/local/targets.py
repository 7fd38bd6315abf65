"""Dense, trivially learnable rewards for quick-start runs with tiny random models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import RewardBackend, ScoreResult, as_scores, check_images, check_lengths


@dataclass(kw_only=True)
class BrightnessTarget(RewardBackend):
    """Reward ``-|mean(pixels) - target|`` per image (mean over C·H·W); 0 is the best score.
    ``target``: the brightness aimed at, in [0, 1]."""

    target: float = 0.8
    name: str = "brightness"

    def __post_init__(self) -> None:
        require(0.0 <= self.target <= 1.0, "BrightnessTarget.target must be in [0, 1]")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "BrightnessTarget", metadata=metadata)
        images = check_images(images, n, "BrightnessTarget").to(self.device, torch.float32)
        values = -(images.mean(dim=(1, 2, 3)) - self.target).abs()
        return ScoreResult(scores={self.name: as_scores(values)})


@dataclass(kw_only=True)
class ColorTarget(RewardBackend):
    """Reward ``-mean_c |mean_{H,W}(pixels_c) - rgb_c|`` per image; 0 is the best score."""

    rgb: Sequence[float] = (1.0, 0.0, 0.0)
    name: str = "color_target"

    def __post_init__(self) -> None:
        self.rgb = tuple(float(c) for c in self.rgb)
        require(
            len(self.rgb) == 3 and all(0.0 <= c <= 1.0 for c in self.rgb),
            f"ColorTarget.rgb={self.rgb}: give three values in [0, 1]",
        )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "ColorTarget", metadata=metadata)
        images = check_images(images, n, "ColorTarget").to(self.device, torch.float32)
        target = torch.tensor(self.rgb, dtype=torch.float32, device=images.device)
        values = -(images.mean(dim=(2, 3)) - target).abs().mean(dim=1)
        return ScoreResult(scores={self.name: as_scores(values)})
