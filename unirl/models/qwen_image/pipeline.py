"""``QwenImagePipeline``: the shared flow-matching pipeline bound to a ``QwenImageBundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline


class QwenImagePipeline(FlowMatchingPipeline):
    """Qwen-Image sampling and replay. Everything family-specific (encoding, true CFG with
    norm rescale, the packed velocity call, decode) is the bundle's; the loop is the shared
    one. (Not diffusers' ``QwenImagePipeline``, which this reproduces and is tested against.)"""
