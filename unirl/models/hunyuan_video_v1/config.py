"""``HunyuanVideoBundleConfig``: what a recipe's ``bundle:`` block may set for HunyuanVideo 1.0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.bundle import FlowMatchingBundleConfig
from unirl.models.common.geometry import check_video_frames

HUNYUAN_VIDEO_VAE = "the HunyuanVideo VAE"  # named in a frame-count error


@dataclass(kw_only=True)
class HunyuanVideoBundleConfig(FlowMatchingBundleConfig):
    """HunyuanVideo 1.0 weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` | ``hunyuan-video-arch`` | a local diffusers folder | a hub id
    (``hunyuanvideo-community/HunyuanVideo``). ``text_encoder_dtype`` is both text encoders'
    precision (Llama and CLIP).

    ``max_sequence_length``: the Llama tokens after the template's crop (every prompt padded
    or cut to exactly this many; the pipeline's 256). ``flow_shift``: the static σ shift;
    None takes the checkpoint scheduler's (7.0 for the released model).
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny", "hunyuan-video-arch")

    max_sequence_length: PositiveInt = 256
    flow_shift: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_sequence_length >= 1,
            f"bundle.max_sequence_length={self.max_sequence_length} must be >= 1 (the "
            "pipeline's: 256)",
        )
        require(
            self.flow_shift is None or self.flow_shift > 0,
            f"bundle.flow_shift={self.flow_shift} must be > 0 (or null for the checkpoint's)",
        )


def check_num_frames(num_frames: int, temporal_factor: int) -> None:
    """``num_frames`` must be ``temporal_factor·k + 1`` (the causal VAE's frame grouping)."""
    check_video_frames(num_frames, temporal_factor, HUNYUAN_VIDEO_VAE)
