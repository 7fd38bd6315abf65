"""``SD3Pipeline``: the shared flow-matching pipeline bound to an ``SD3Bundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline


class SD3Pipeline(FlowMatchingPipeline):
    """SD3 / SD3.5 sampling and replay. Everything family-specific (encoding, CFG row layout,
    velocity, decode) is the bundle's; the loop is the shared one."""
