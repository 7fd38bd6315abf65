"""``WanBundleConfig``: what a recipe's ``bundle:`` block may set for Wan 2.1 / 2.2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.bundle import FlowMatchingBundleConfig
from unirl.models.common.geometry import check_video_frames

# which experts of a two-expert (Wan 2.2) model train
TrainExperts = Literal["both", "high", "low"]
TRAIN_EXPERTS: tuple[str, ...] = ("both", "high", "low")

WAN_VAE = "the Wan VAE"  # named in a frame-count error


@dataclass(kw_only=True)
class WanBundleConfig(FlowMatchingBundleConfig):
    """Wan weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` (Wan 2.1 T2V) | ``tiny-wan2.2`` (two experts) | ``tiny-i2v`` (Wan 2.1 I2V)
    | ``wan2.1-1.3b-arch`` | ``wan2.2-14b-arch`` | a local diffusers folder | a hub id
    (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``). ``text_encoder_dtype`` is the UMT5 encoder's (and
    the CLIP image encoder's) precision.

    ``max_sequence_length``: text tokens; every prompt is padded to it with zero embeddings (as
    ``WanPipeline`` does; its default is 512, and the I2V transformer requires 512).
    ``flow_shift``: the static σ shift; None takes the checkpoint scheduler's (3.0 for the
    released 480p models; Wan recommends 5.0 at 720p).

    Two-expert models (Wan 2.2): ``boundary_ratio`` is the σ at and above which the high-noise
    expert (``transformer``) runs, below it the low-noise one (``transformer_2``); None takes
    the checkpoint's (``model_index.json``, 0.875 for Wan 2.2 T2V). ``train_experts``: which
    experts train, ``both`` | ``high`` | ``low``; the other is frozen. One-expert models (Wan
    2.1) accept only ``both`` (the one transformer) and no ``boundary_ratio``.
    """

    preset_names: ClassVar[tuple[str, ...]] = (
        "tiny",
        "tiny-wan2.2",
        "tiny-i2v",
        "wan2.1-1.3b-arch",
        "wan2.2-14b-arch",
    )

    max_sequence_length: PositiveInt = 512
    flow_shift: float | None = None
    boundary_ratio: float | None = None
    train_experts: TrainExperts = "both"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_sequence_length >= 1,
            f"bundle.max_sequence_length={self.max_sequence_length} must be >= 1 (Wan's default: 512)",
        )
        require(
            self.flow_shift is None or self.flow_shift > 0,
            f"bundle.flow_shift={self.flow_shift} must be > 0 (or null for the checkpoint's)",
        )
        require(
            self.boundary_ratio is None or 0.0 < self.boundary_ratio < 1.0,
            f"bundle.boundary_ratio={self.boundary_ratio} must be in (0, 1) (the σ where the "
            "low-noise expert takes over), or null for the checkpoint's",
        )
        require(
            self.train_experts in TRAIN_EXPERTS,
            f"bundle.train_experts={self.train_experts!r} must be one of {TRAIN_EXPERTS}",
        )


def trainable_attr_for(train_experts: str, two_experts: bool) -> str:
    """Where the trained module lives on the bundle: ``transformer`` (Wan 2.1, or the
    high-noise expert), ``transformer_2`` (the low-noise one), ``experts`` (both)."""
    if not two_experts:
        return "transformer"
    return {"both": "experts", "high": "transformer", "low": "transformer_2"}[train_experts]


# diffusers' Wan attention reads the context as [CLIP image tokens; the last 512 tokens as text]
IMAGE_MODEL_TEXT_TOKENS = 512


def check_text_tokens(takes_image_tokens: bool, max_sequence_length: int) -> None:
    """A model with CLIP image tokens (Wan 2.1 I2V) needs exactly 512 text tokens: its
    attention splits the context at 512 from the end; another length silently mixes image
    and text tokens."""
    require(
        not takes_image_tokens or max_sequence_length == IMAGE_MODEL_TEXT_TOKENS,
        f"bundle.max_sequence_length={max_sequence_length} but this Wan image-to-video model "
        f"reads the last {IMAGE_MODEL_TEXT_TOKENS} context tokens as text (CLIP image tokens "
        f"first); set bundle.max_sequence_length: {IMAGE_MODEL_TEXT_TOKENS}",
    )


def check_num_frames(num_frames: int, temporal_factor: int) -> None:
    """``num_frames`` must be ``temporal_factor·k + 1`` (the causal VAE's frame grouping)."""
    check_video_frames(num_frames, temporal_factor, WAN_VAE)


def check_expert_choice(two_experts: bool, train_experts: str, boundary_ratio: object) -> None:
    """Refuse expert settings the model cannot take (one line naming the field)."""
    if two_experts:
        return
    require(
        train_experts == "both",
        f"bundle.train_experts={train_experts} but this Wan model has one transformer (Wan "
        "2.1); use train_experts: both (the one transformer), or a two-expert Wan 2.2 model",
    )
    require(
        boundary_ratio is None,
        "bundle.boundary_ratio is set but this Wan model has one transformer (Wan 2.1); drop it",
    )
