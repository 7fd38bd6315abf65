"""``QwenVLBundleConfig``: the ``bundle:`` block of a Qwen2.5-VL recipe."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from unirl.config.require import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common_ar.config import CausalLMBundleConfig
from unirl.models.qwen_vl.vision import MERGE, PATCH

PRESET_NAMES = ("tiny", "qwen2.5-vl-3b-arch", "qwen2.5-vl-7b-arch")


@dataclasses.dataclass(kw_only=True)
class QwenVLBundleConfig(CausalLMBundleConfig):
    """Every field of :class:`CausalLMBundleConfig` plus ``image_size``: each prompt's image is
    resized to ``image_size x image_size`` (a multiple of 28) before the vision tower, so an
    image always takes ``(image_size / 28)²`` tokens of the prompt."""

    preset_names: ClassVar[tuple[str, ...]] = PRESET_NAMES

    image_size: PositiveInt = 448

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.image_size % (PATCH * MERGE) == 0,
            f"bundle.image_size={self.image_size} must be a multiple of {PATCH * MERGE} "
            "(14-pixel patches merged 2x2)",
        )
