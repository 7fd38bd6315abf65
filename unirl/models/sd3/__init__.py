"""Stable Diffusion 3 / 3.5 (MMDiT, flow matching): bundle, conditions, encoding, presets."""

from __future__ import annotations

from unirl.models.sd3.arch import (
    SD3ArchSpec,
    build_arch_modules,
    count_transformer_params,
    sd35_medium_arch_spec,
)
from unirl.models.sd3.bundle import SD3Bundle
from unirl.models.sd3.conditions import SD3Conditions
from unirl.models.sd3.config import SD3BundleConfig
from unirl.models.sd3.engine_maps import SD3EngineMaps
from unirl.models.sd3.pipeline import SD3Pipeline
from unirl.models.sd3.presets import (
    PRESET_NAMES,
    SD35_MEDIUM_ARCH,
    TINY,
    ModelSourceError,
    arch_spec,
    cache_root,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.sd3.text_encode import SD3TextStack, encode_sd3_prompts
from unirl.models.sd3.tiny import TinySD3Spec, build_tiny_pipeline

__all__ = [
    "PRESET_NAMES",
    "SD35_MEDIUM_ARCH",
    "TINY",
    "ModelSourceError",
    "SD3ArchSpec",
    "SD3Bundle",
    "SD3BundleConfig",
    "SD3Conditions",
    "SD3EngineMaps",
    "SD3Pipeline",
    "SD3TextStack",
    "TinySD3Spec",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "cache_root",
    "count_transformer_params",
    "encode_sd3_prompts",
    "resolve_model_source",
    "sd35_medium_arch_spec",
    "tiny_preset_path",
]
