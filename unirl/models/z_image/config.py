"""``ZImageBundleConfig``: what a recipe's ``bundle:`` block may set for Z-Image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.bundle import FlowMatchingBundleConfig


@dataclass(kw_only=True)
class ZImageBundleConfig(FlowMatchingBundleConfig):
    """Z-Image weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` | ``z-image-arch`` | a local diffusers folder | a hub id
    (``Tongyi-MAI/Z-Image``, ``Tongyi-MAI/Z-Image-Turbo``). ``text_encoder_dtype`` is the
    Qwen3 encoder's precision.

    ``max_sequence_length``: the tokenizer's cap, chat-template tokens included (the
    pipeline's default 512); each prompt keeps only its real tokens, so a short prompt costs
    no padding in the transformer.

    The two CFG knobs of ``ZImagePipeline`` (they shape the guided velocity, so they are part
    of the policy and apply in sampling and replay alike):
    ``cfg_normalization``: 0 (off, the pipeline's default) or k > 0: each sample's guided
    velocity is scaled down to at most k times the norm of its conditional velocity (the
    pipeline's ``cfg_normalization=True`` is k = 1);
    ``cfg_truncation``: guidance stops (one conditional forward) at the steps whose
    ``1 - σ`` exceeds it; 1 (the default) never stops.

    ``cfg_split_uneven``: when the prompt's and the negative prompt's captions pad to
    different lengths, run them as two forwards instead of one masked batch (``ZImageCFG``):
    equal up to float rounding, and a compiled block keeps symbolic shapes (on CUDA the
    masked one was specialized to each length). False (the default) is the pipeline's one
    batched forward, bit for bit.
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny", "z-image-arch")

    max_sequence_length: PositiveInt = 512
    cfg_normalization: float = 0.0
    cfg_truncation: float = 1.0
    cfg_split_uneven: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_sequence_length >= 1,
            f"bundle.max_sequence_length={self.max_sequence_length} must be >= 1 (the pipeline's "
            "default is 512, chat-template tokens included)",
        )
        require(
            self.cfg_normalization >= 0.0,
            f"bundle.cfg_normalization={self.cfg_normalization} must be >= 0 (0 turns it off; "
            "1 is the pipeline's cfg_normalization=True)",
        )
        require(
            0.0 <= self.cfg_truncation <= 1.0,
            f"bundle.cfg_truncation={self.cfg_truncation} must be in [0, 1] (CFG stops where "
            "1 - sigma exceeds it; 1 never stops)",
        )
