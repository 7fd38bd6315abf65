"""``HunyuanVideo15BundleConfig``: what a recipe's ``bundle:`` block may set for HunyuanVideo 1.5."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unirl.config import require
from unirl.config.typecheck import NonNegativeInt, PositiveInt
from unirl.models.common.bundle import FlowMatchingBundleConfig
from unirl.models.common.geometry import check_video_frames

# The pipeline's count of SigLIP image tokens (``vision_num_semantic_tokens``): a text-to-video
# forward carries that many zero, masked-out image slots.
PIPELINE_IMAGE_TOKENS = 729

HUNYUAN_VIDEO_VAE = "the HunyuanVideo 1.5 VAE"  # named in a frame-count error


@dataclass(kw_only=True)
class HunyuanVideo15BundleConfig(FlowMatchingBundleConfig):
    """HunyuanVideo 1.5 weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` | ``hunyuan-video-1.5-arch`` | a local diffusers folder | a hub id
    (``hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v``). ``text_encoder_dtype`` is
    both text encoders' precision (Qwen2.5-VL and the ByT5 glyph encoder).

    ``max_sequence_length``: the multimodal LLM's tokens after its chat template (every prompt
    padded or cut to exactly this many; the pipeline's 1000). ``glyph_max_sequence_length``:
    the ByT5 bytes of the quoted texts (the pipeline's 256). ``image_tokens``: the zero,
    masked-out image slots every text-to-video forward carries (the pipeline's 729); they
    change no output, so fewer only save attention compute (0 is allowed). ``flow_shift``:
    the static σ shift; None takes the checkpoint scheduler's (5.0 for the 480p models, 9.0
    for the 720p text-to-video one).
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny", "hunyuan-video-1.5-arch")

    max_sequence_length: PositiveInt = 1000
    glyph_max_sequence_length: PositiveInt = 256
    image_tokens: NonNegativeInt = PIPELINE_IMAGE_TOKENS
    flow_shift: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_sequence_length >= 1,
            f"bundle.max_sequence_length={self.max_sequence_length} must be >= 1 (the "
            "pipeline's: 1000)",
        )
        require(
            self.glyph_max_sequence_length >= 1,
            f"bundle.glyph_max_sequence_length={self.glyph_max_sequence_length} must be >= 1 "
            "(the pipeline's: 256)",
        )
        require(
            self.image_tokens >= 0,
            f"bundle.image_tokens={self.image_tokens} must be >= 0 (the pipeline's: 729)",
        )
        require(
            self.flow_shift is None or self.flow_shift > 0,
            f"bundle.flow_shift={self.flow_shift} must be > 0 (or null for the checkpoint's)",
        )


def check_num_frames(num_frames: int, temporal_factor: int) -> None:
    """``num_frames`` must be ``temporal_factor·k + 1`` (the causal VAE's frame grouping)."""
    check_video_frames(num_frames, temporal_factor, HUNYUAN_VIDEO_VAE)
