"""Wan 2.1 / 2.2 (video DiT with a UMT5 text encoder and a 3D causal VAE, flow matching; Wan 2.2
with a high- and a low-noise expert): bundle, conditions, encoding, presets."""

from __future__ import annotations

from unirl.models.wan.arch import (
    WanArchSpec,
    build_arch_modules,
    count_params,
    wan21_1_3b_arch_spec,
    wan22_14b_arch_spec,
)
from unirl.models.wan.bundle import WanBundle
from unirl.models.wan.conditions import WanConditions
from unirl.models.wan.config import WanBundleConfig
from unirl.models.wan.experts import WanExperts, split_expert_lora
from unirl.models.wan.pipeline import WanPipeline
from unirl.models.wan.presets import (
    PRESET_NAMES,
    WAN21_ARCH,
    WAN22_ARCH,
    arch_spec,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.wan.text_encode import encode_umt5_prompts
from unirl.models.wan.tiny import TinyWanSpec, build_tiny_pipeline

__all__ = [
    "PRESET_NAMES",
    "WAN21_ARCH",
    "WAN22_ARCH",
    "TinyWanSpec",
    "WanArchSpec",
    "WanBundle",
    "WanBundleConfig",
    "WanConditions",
    "WanExperts",
    "WanPipeline",
    "arch_spec",
    "build_arch_modules",
    "build_tiny_pipeline",
    "count_params",
    "encode_umt5_prompts",
    "resolve_model_source",
    "split_expert_lora",
    "tiny_preset_path",
    "wan21_1_3b_arch_spec",
    "wan22_14b_arch_spec",
]
