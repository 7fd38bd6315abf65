"""``Qwen3BundleConfig``: the ``bundle:`` block of a Qwen3 recipe."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from unirl.models.common_ar.config import CausalLMBundleConfig
from unirl.models.qwen3.presets import PRESET_NAMES


@dataclasses.dataclass(kw_only=True)
class Qwen3BundleConfig(CausalLMBundleConfig):
    """Every field of :class:`CausalLMBundleConfig`; ``path`` may also name
    ``qwen3-{0.6b,1.7b,4b,8b}-arch``."""

    preset_names: ClassVar[tuple[str, ...]] = PRESET_NAMES
