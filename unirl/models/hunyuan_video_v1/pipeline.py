"""``HunyuanVideoPipeline``: the shared flow-matching pipeline bound to a ``HunyuanVideoBundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline


class HunyuanVideoPipeline(FlowMatchingPipeline):
    """HunyuanVideo 1.0 sampling and replay. Everything family-specific (the two text encoders,
    the embedded guidance, decode to video) is the bundle's; the loop is the shared one. (Not
    diffusers' class of the same name, which this reproduces and is tested against.)"""
