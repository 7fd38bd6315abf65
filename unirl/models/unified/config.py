"""``TransfusionBundleConfig``: the ``bundle:`` block of the unified (transfusion) family."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from unirl.config.precision import canonical_precision
from unirl.config.require import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common_ar.config import CausalLMBundleConfig

PRESET_NAMES: tuple[str, ...] = ("tiny",)


@dataclasses.dataclass(kw_only=True)
class TransfusionBundleConfig(CausalLMBundleConfig):
    """Every field of :class:`CausalLMBundleConfig` (the text side: prompt formatting,
    precision, device) plus the image side: ``patch_size`` (latent pixels per image token
    side), ``max_grid`` (the longest patch-grid side the position table holds),
    ``image_seed`` (the image head's random init), ``vae_dtype`` and ``decode_chunk_size``.
    ``path``: ``tiny`` only (the tiny Qwen3 backbone and the tiny SD3 VAE, both built
    locally; the image head is drawn from ``image_seed``)."""

    preset_names: ClassVar[tuple[str, ...]] = PRESET_NAMES

    patch_size: PositiveInt = 2
    max_grid: PositiveInt = 16
    image_seed: int = 0
    vae_dtype: str = "fp32"
    decode_chunk_size: PositiveInt = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        self.vae_dtype = canonical_precision(self.vae_dtype, "bundle.vae_dtype")
        require(
            self.path in PRESET_NAMES,
            f"bundle.path={self.path!r}: the transfusion family has only the 'tiny' preset "
            "(random init, built locally); the real HunyuanImage-3.0 is served by vLLM-Omni "
            "(recipe unified_model/hi3_vllmomni)",
        )
        require(self.patch_size >= 1, "bundle.patch_size must be >= 1")
