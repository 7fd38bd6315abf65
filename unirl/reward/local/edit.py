"""Local edit rewards: each compares an edited image with its source inside / outside the edit
region the prompt names (``metadata["edit_box"]``), no download, learnable by a tiny model.

The edit region is ``edit_box = [x0, y0, x1, y1]`` in fractions of the width / height
(``[0.25, 0.25, 0.75, 0.75]`` is the centre quarter); a prompt without one edits the whole
image. ``datasets/make_edit_prompts.py`` writes both fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.reward.base import (
    EditRewardBackend,
    RewardError,
    ScoreResult,
    as_scores,
    check_images,
    check_lengths,
)


def edit_mask(meta: Mapping[str, object], height: int, width: int) -> Tensor:
    """``BoolTensor[H, W]``: True inside the sample's ``edit_box`` (the whole image without
    one). Pixel ``(y, x)`` is inside when its centre is."""
    box = meta.get("edit_box")
    if box is None:
        return torch.ones(height, width, dtype=torch.bool)
    if not (isinstance(box, list | tuple) and len(box) == 4):
        raise RewardError(f"metadata edit_box={box!r}: give [x0, y0, x1, y1] in [0, 1]")
    x0, y0, x1, y1 = (float(v) for v in box)
    if not (0.0 <= x0 < x1 <= 1.0 and 0.0 <= y0 < y1 <= 1.0):
        raise RewardError(f"metadata edit_box={box!r}: need 0 <= x0 < x1 <= 1, 0 <= y0 < y1 <= 1")
    ys = (torch.arange(height, dtype=torch.float32) + 0.5) / height
    xs = (torch.arange(width, dtype=torch.float32) + 0.5) / width
    inside_y = (ys >= y0) & (ys < y1)
    inside_x = (xs >= x0) & (xs < x1)
    return inside_y[:, None] & inside_x[None, :]


def _pairs(
    name: str,
    images: Tensor,
    sources: Tensor,
    prompts: list[str],
    metadata: list[dict],
    pool: int,
) -> tuple[Tensor, Tensor]:
    """Results and sources, checked, average-pooled over ``pool x pool`` blocks."""
    n = len(prompts)
    check_lengths(n, name, metadata=metadata)
    images = check_images(images, n, name).float()
    sources = check_images(sources, n, f"{name} (sources)").float()
    if sources.shape != images.shape:
        raise RewardError(
            f"{name}: sources {tuple(sources.shape)} and results {tuple(images.shape)} differ; "
            "reference images are resized to the sampled size by the trainer"
        )
    h, w = images.shape[-2:]
    if h % pool or w % pool:
        raise RewardError(f"{name}.pool={pool} does not divide the {h}x{w} images")
    sources = sources.to(images.device)
    if pool > 1:
        images, sources = F.avg_pool2d(images, pool), F.avg_pool2d(sources, pool)
    return images, sources


@dataclass(kw_only=True)
class SourcePreservation(EditRewardBackend):
    """``1 - mean |result - source|`` over the pixels outside the edit region (all three
    channels): 1 leaves the rest of the image untouched, 0 is the farthest change. ``pool``
    compares ``pool x pool`` block averages instead of pixels (layout and colour, not
    texture; a block belongs to the region when its centre does). A sample whose box covers
    the whole image scores NaN with an error (nothing to preserve)."""

    name: str = "preserve"
    pool: PositiveInt = 1

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        images, sources = _pairs(
            "SourcePreservation", images, sources, prompts, metadata, self.pool
        )
        h, w = images.shape[-2:]
        values: list[float] = []
        errors: list[str | None] = []
        for i, meta in enumerate(metadata):
            outside = ~edit_mask(meta, h, w).to(images.device)
            if not bool(outside.any()):
                values.append(math.nan)
                errors.append("edit_box covers the whole image: no pixel to preserve")
                continue
            diff = (images[i] - sources[i]).abs().mean(dim=0)  # [H, W]
            values.append(1.0 - float(diff[outside].mean()))
            errors.append(None)
        return ScoreResult(scores={self.name: as_scores(values)}, errors={self.name: errors})


@dataclass(kw_only=True)
class RegionColorTarget(EditRewardBackend):
    """``1 - mean |result - target_color|`` over the pixels inside the edit region (the
    instruction's colour, ``metadata["target_color"] = [r, g, b]`` in [0, 1]). With
    ``relative=True`` the score is the improvement over the source's own distance, so an
    unedited image scores 0 and a perfect edit ``1 - d(source)``. ``pool`` compares
    ``pool x pool`` block averages (as :class:`SourcePreservation`). A sample without
    ``target_color`` scores NaN with an error."""

    name: str = "region_color"
    relative: bool = False
    pool: PositiveInt = 1

    def __post_init__(self) -> None:
        require(bool(self.name), "RegionColorTarget.name must be a non-empty string")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        images, sources = _pairs("RegionColorTarget", images, sources, prompts, metadata, self.pool)
        h, w = images.shape[-2:]
        values: list[float] = []
        errors: list[str | None] = []
        for i, meta in enumerate(metadata):
            color = meta.get("target_color")
            if not (isinstance(color, list | tuple) and len(color) == 3):
                values.append(math.nan)
                errors.append(f"metadata target_color={color!r}: give [r, g, b] in [0, 1]")
                continue
            target = torch.tensor([float(c) for c in color], device=images.device)[:, None]
            inside = edit_mask(meta, h, w).to(images.device)
            dist = (images[i][:, inside] - target).abs().mean()
            value = 1.0 - float(dist)
            if self.relative:
                value = float((sources[i][:, inside] - target).abs().mean()) - float(dist)
            values.append(value)
            errors.append(None)
        return ScoreResult(scores={self.name: as_scores(values)}, errors={self.name: errors})
