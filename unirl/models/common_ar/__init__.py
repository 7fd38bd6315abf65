"""What every autoregressive family shares: the bundle base, the sampling loop, the token
policy (packed replay), prompt conditions, weight sources and tiny-preset pieces (README.md)."""

from __future__ import annotations

from unirl.models.common_ar.bundle import CausalLMBundle
from unirl.models.common_ar.conditions import PromptConditions
from unirl.models.common_ar.config import CausalLMBundleConfig
from unirl.models.common_ar.generate import Completion, draw_tokens, generate_completions
from unirl.models.common_ar.pipeline import CausalLMPipeline

__all__ = [
    "CausalLMBundle",
    "CausalLMBundleConfig",
    "CausalLMPipeline",
    "Completion",
    "PromptConditions",
    "draw_tokens",
    "generate_completions",
]
