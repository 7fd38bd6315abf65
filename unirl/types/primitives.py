"""Media primitives carried by requests and tracks: ``Texts``, ``Images``, ``Videos``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types.batch import Batch, batch_field


@dataclass(kw_only=True)
class Texts(Batch):
    """Per-sample strings (prompts, generated text)."""

    texts: list[str] = batch_field("concat")

    def __post_init__(self) -> None:
        if not all(isinstance(t, str) for t in self.texts):
            raise TypeError("Texts.texts must be a list of str")


@dataclass(kw_only=True)
class Images(Batch):
    """``pixels[N, 3, H, W]`` float32 in [0, 1]."""

    pixels: torch.Tensor = batch_field("concat")

    def __post_init__(self) -> None:
        if self.pixels.ndim != 4 or self.pixels.shape[1] != 3:
            raise ValueError(f"Images.pixels must be [N, 3, H, W], got {tuple(self.pixels.shape)}")


@dataclass(kw_only=True)
class Videos(Batch):
    """``frames[N, T, 3, H, W]`` float32 in [0, 1]; ``fps`` is shared."""

    frames: torch.Tensor = batch_field("concat")
    fps: float = batch_field("shared", default=16.0)

    def __post_init__(self) -> None:
        if self.frames.ndim != 5 or self.frames.shape[2] != 3:
            raise ValueError(
                f"Videos.frames must be [N, T, 3, H, W], got {tuple(self.frames.shape)}"
            )
