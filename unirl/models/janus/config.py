"""``JanusBundleConfig``: the ``bundle:`` block of a Janus-Pro recipe."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from unirl.config.precision import canonical_precision
from unirl.config.typecheck import PositiveInt
from unirl.models.common_ar.config import CausalLMBundleConfig
from unirl.models.janus.presets import PRESET_NAMES


@dataclasses.dataclass(kw_only=True)
class JanusBundleConfig(CausalLMBundleConfig):
    """Every field of :class:`CausalLMBundleConfig` (``path``: ``tiny`` |
    ``janus-pro-{1b,7b}-arch`` | a local ``save_pretrained`` folder | a hub id such as
    ``deepseek-community/Janus-Pro-7B``) plus the image side: ``vq_dtype`` (the frozen VQ
    decoder's precision) and ``decode_chunk_size`` (images decoded per call)."""

    preset_names: ClassVar[tuple[str, ...]] = PRESET_NAMES

    vq_dtype: str = "fp32"
    decode_chunk_size: PositiveInt = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        self.vq_dtype = canonical_precision(self.vq_dtype, "bundle.vq_dtype")
