"""A unified (transfusion-style) model: one transformer that writes text and denoises images
(see README.md)."""

from __future__ import annotations

from unirl.models.unified.bundle import TransfusionBundle
from unirl.models.unified.conditions import ContextConditions
from unirl.models.unified.config import PRESET_NAMES, TransfusionBundleConfig
from unirl.models.unified.hunyuan_image3 import HunyuanImage3Bundle, HunyuanImage3BundleConfig
from unirl.models.unified.model import ImageHead, TransfusionModel, image_attention_mask
from unirl.models.unified.pipeline import (
    IMAGE_TRACK,
    TEXT_TRACK,
    TransfusionImagePipeline,
    TransfusionPipeline,
    TransfusionTextPipeline,
)

__all__ = [
    "IMAGE_TRACK",
    "PRESET_NAMES",
    "TEXT_TRACK",
    "ContextConditions",
    "HunyuanImage3Bundle",
    "HunyuanImage3BundleConfig",
    "ImageHead",
    "TransfusionBundle",
    "TransfusionBundleConfig",
    "TransfusionImagePipeline",
    "TransfusionModel",
    "TransfusionPipeline",
    "TransfusionTextPipeline",
    "image_attention_mask",
]
