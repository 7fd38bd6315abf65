"""``WanPipeline``: the shared flow-matching pipeline bound to a ``WanBundle``."""

from __future__ import annotations

from unirl.models.common.pipeline import FlowMatchingPipeline
from unirl.types import Conditions, DiffusionSamplingParams


class WanPipeline(FlowMatchingPipeline):
    """Wan sampling and replay. Everything family-specific (UMT5 encoding, the first frame of
    I2V, the expert of each σ, decode to video) is the bundle's; the loop is the shared one.
    The one addition: the encoded rows carry the request's video shape (``num_frames``,
    ``height``, ``width``), which an image-to-video bundle needs to encode the first frames.
    (Not diffusers' ``WanPipeline``, which this reproduces and is tested against.)"""

    def encode(
        self, prompts: list[str], params: DiffusionSamplingParams, guidance_scale: float
    ) -> Conditions:
        conditions = super().encode(prompts, params, guidance_scale)
        return conditions.with_video_shape(  # type: ignore[attr-defined]
            int(params.num_frames), int(params.height), int(params.width)
        )
