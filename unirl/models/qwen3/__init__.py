"""Qwen3 causal LMs: bundle, pipeline (sampler + token policy), presets (see README.md)."""

from __future__ import annotations

from unirl.models.qwen3.bundle import Qwen3Bundle
from unirl.models.qwen3.config import Qwen3BundleConfig
from unirl.models.qwen3.pipeline import Qwen3Pipeline
from unirl.models.qwen3.presets import PRESET_NAMES, tiny_preset_path
from unirl.models.qwen3.tiny import TinyQwen3Spec

__all__ = [
    "PRESET_NAMES",
    "Qwen3Bundle",
    "Qwen3BundleConfig",
    "Qwen3Pipeline",
    "TinyQwen3Spec",
    "tiny_preset_path",
]
