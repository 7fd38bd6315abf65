"""HunyuanVideo 1.5 (a dual-stream video DiT with a Qwen2.5-VL text encoder, a ByT5 glyph
encoder and a 32-channel 3D causal VAE, flow matching): bundle, conditions, encoding, presets."""

from __future__ import annotations

from unirl.models.hunyuan_video.arch import (
    HunyuanVideo15ArchSpec,
    build_arch_modules,
    count_params,
    hunyuan_video15_arch_spec,
)
from unirl.models.hunyuan_video.bundle import HunyuanVideo15Bundle
from unirl.models.hunyuan_video.conditions import HunyuanVideo15Conditions
from unirl.models.hunyuan_video.config import HunyuanVideo15BundleConfig
from unirl.models.hunyuan_video.pipeline import HunyuanVideo15Pipeline
from unirl.models.hunyuan_video.presets import (
    HUNYUAN_VIDEO15_ARCH,
    PRESET_NAMES,
    arch_spec,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.hunyuan_video.text_encode import (
    encode_glyph_prompts,
    encode_mllm_prompts,
    pipeline_prompt_template,
)
from unirl.models.hunyuan_video.tiny import TinyHunyuanVideo15Spec, build_tiny_pipeline

__all__ = [
    "HUNYUAN_VIDEO15_ARCH",
    "PRESET_NAMES",
    "HunyuanVideo15ArchSpec",
    "HunyuanVideo15Bundle",
    "HunyuanVideo15BundleConfig",
    "HunyuanVideo15Conditions",
    "HunyuanVideo15Pipeline",
    "TinyHunyuanVideo15Spec",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "count_params",
    "encode_glyph_prompts",
    "encode_mllm_prompts",
    "hunyuan_video15_arch_spec",
    "pipeline_prompt_template",
    "resolve_model_source",
    "tiny_preset_path",
]
