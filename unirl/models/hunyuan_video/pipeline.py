"""``HunyuanVideo15Pipeline``: the shared flow-matching pipeline bound to a ``HunyuanVideo15Bundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline


class HunyuanVideo15Pipeline(FlowMatchingPipeline):
    """HunyuanVideo 1.5 sampling and replay. Everything family-specific (the two text encoders,
    the zero condition channels, decode to video) is the bundle's; the loop is the shared one.
    (Not diffusers' class of the same name, which this reproduces and is tested against.)"""
