"""Z-Image (single-stream DiT with a Qwen3 text encoder, flow matching): bundle, conditions,
guidance, encoding, presets."""

from __future__ import annotations

from unirl.models.z_image.arch import (
    ZImageArchSpec,
    build_arch_modules,
    count_params,
    z_image_arch_spec,
)
from unirl.models.z_image.bundle import ZImageBundle
from unirl.models.z_image.conditions import ZImageConditions
from unirl.models.z_image.config import ZImageBundleConfig
from unirl.models.z_image.engine_maps import ZImageEngineMaps
from unirl.models.z_image.guidance import ZImageCFG
from unirl.models.z_image.pipeline import ZImagePipeline
from unirl.models.z_image.presets import (
    PRESET_NAMES,
    Z_IMAGE_ARCH,
    arch_spec,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.z_image.text_encode import encode_z_image_prompts
from unirl.models.z_image.tiny import TinyZImageSpec, build_tiny_pipeline

__all__ = [
    "PRESET_NAMES",
    "Z_IMAGE_ARCH",
    "TinyZImageSpec",
    "ZImageArchSpec",
    "ZImageBundle",
    "ZImageBundleConfig",
    "ZImageCFG",
    "ZImageConditions",
    "ZImageEngineMaps",
    "ZImagePipeline",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "count_params",
    "encode_z_image_prompts",
    "resolve_model_source",
    "tiny_preset_path",
    "z_image_arch_spec",
]
