"""``Flux2KleinPipeline``: the shared flow-matching pipeline bound to a ``Flux2KleinBundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline


class Flux2KleinPipeline(FlowMatchingPipeline):
    """FLUX.2-Klein sampling and replay, text-to-image and editing (a request's
    ``primitives["image"]`` reach ``bundle.encode_references``). Everything family-specific
    (encoding, guidance, the packed velocity call with reference tokens, decode) is the
    bundle's; the loop is the shared one. (Not diffusers' ``Flux2KleinPipeline``, which this
    reproduces and is tested against.)"""
