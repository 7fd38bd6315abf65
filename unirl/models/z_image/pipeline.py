"""``ZImagePipeline``: the shared flow-matching pipeline bound to a ``ZImageBundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline


class ZImagePipeline(FlowMatchingPipeline):
    """Z-Image sampling and replay. Everything family-specific (encoding, Z-Image's CFG, the
    velocity call on caption lists, decode) is the bundle's; the loop is the shared one. (Not
    diffusers' ``ZImagePipeline``, which this reproduces and is tested against.)"""
