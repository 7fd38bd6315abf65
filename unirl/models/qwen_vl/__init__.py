"""Qwen2.5-VL (vision-language): bundle, pipeline (sampler + token policy with one image per
sample), presets and the image layout (see README.md)."""

from __future__ import annotations

from unirl.models.qwen_vl.bundle import QwenVLBundle
from unirl.models.qwen_vl.conditions import VisionPromptConditions
from unirl.models.qwen_vl.config import QwenVLBundleConfig
from unirl.models.qwen_vl.pipeline import QwenVLPipeline
from unirl.models.qwen_vl.presets import PRESET_NAMES, tiny_preset_path

__all__ = [
    "PRESET_NAMES",
    "QwenVLBundle",
    "QwenVLBundleConfig",
    "QwenVLPipeline",
    "VisionPromptConditions",
    "tiny_preset_path",
]
