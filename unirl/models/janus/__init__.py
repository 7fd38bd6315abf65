"""Janus-Pro (``JanusForConditionalGeneration``): one LLaMA decoder that reads images through
SigLIP, writes text, and writes images as VQ tokens (see README.md)."""

from __future__ import annotations

from unirl.models.janus.bundle import JanusBundle
from unirl.models.janus.conditions import (
    ImageTokenConditions,
    ImageTokenRequest,
    ImageTokenSamplingParams,
)
from unirl.models.janus.config import JanusBundleConfig
from unirl.models.janus.model import JanusPolicy
from unirl.models.janus.pipeline import (
    IMAGE_TRACK,
    TEXT_TRACK,
    JanusImagePipeline,
    JanusPipeline,
    JanusTextPipeline,
)
from unirl.models.janus.presets import PRESET_NAMES

__all__ = [
    "IMAGE_TRACK",
    "PRESET_NAMES",
    "TEXT_TRACK",
    "ImageTokenConditions",
    "ImageTokenRequest",
    "ImageTokenSamplingParams",
    "JanusBundle",
    "JanusBundleConfig",
    "JanusImagePipeline",
    "JanusPipeline",
    "JanusPolicy",
    "JanusTextPipeline",
]
