"""What a vision-language text track carries beside its tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.models.common_ar.conditions import PromptConditions
from unirl.types import Packed, batch_field


@dataclass(kw_only=True)
class VisionPromptConditions(PromptConditions):
    """``pixel_values``: each sample's image patches (packed rows ``[n_i, 1176]``, the vision
    tower's input); ``image_grid_thw[N, 3]``: each image's patch grid."""

    pixel_values: Packed = batch_field("packed")
    image_grid_thw: torch.Tensor = batch_field("concat")
