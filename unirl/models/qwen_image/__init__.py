"""Qwen-Image (MMDiT with a Qwen2.5-VL text encoder, flow matching): bundle, conditions,
encoding, presets."""

from __future__ import annotations

from unirl.models.qwen_image.arch import (
    QwenImageArchSpec,
    build_arch_modules,
    count_params,
    qwen_image_arch_spec,
)
from unirl.models.qwen_image.bundle import QwenImageBundle
from unirl.models.qwen_image.conditions import QwenImageConditions
from unirl.models.qwen_image.config import QwenImageBundleConfig
from unirl.models.qwen_image.engine_maps import QwenImageEngineMaps
from unirl.models.qwen_image.pipeline import QwenImagePipeline
from unirl.models.qwen_image.presets import (
    PRESET_NAMES,
    QWEN_IMAGE_ARCH,
    arch_spec,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.qwen_image.text_encode import encode_qwen_prompts, pipeline_prompt_template
from unirl.models.qwen_image.tiny import TinyQwenImageSpec, build_tiny_pipeline

__all__ = [
    "PRESET_NAMES",
    "QWEN_IMAGE_ARCH",
    "QwenImageArchSpec",
    "QwenImageBundle",
    "QwenImageBundleConfig",
    "QwenImageConditions",
    "QwenImageEngineMaps",
    "QwenImagePipeline",
    "TinyQwenImageSpec",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "count_params",
    "encode_qwen_prompts",
    "pipeline_prompt_template",
    "qwen_image_arch_spec",
    "resolve_model_source",
    "tiny_preset_path",
]
