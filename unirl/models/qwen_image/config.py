"""``QwenImageBundleConfig``: what a recipe's ``bundle:`` block may set for Qwen-Image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.bundle import FlowMatchingBundleConfig

# The Qwen-Image pipeline refuses more text tokens than this (its tokenizer cap).
MAX_TEXT_TOKENS = 1024


@dataclass(kw_only=True)
class QwenImageBundleConfig(FlowMatchingBundleConfig):
    """Qwen-Image weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` | ``qwen-image-arch`` | a local diffusers folder | a hub id
    (``Qwen/Qwen-Image``). ``text_encoder_dtype`` is the Qwen2.5-VL encoder's precision.
    ``max_sequence_length`` caps the prompt tokens after the chat-template prefix (the
    pipeline's default is 512, its limit 1024); a batch is padded to its longest prompt, not
    to this cap.
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny", "qwen-image-arch")

    max_sequence_length: PositiveInt = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            1 <= self.max_sequence_length <= MAX_TEXT_TOKENS,
            f"bundle.max_sequence_length={self.max_sequence_length} must be in "
            f"[1, {MAX_TEXT_TOKENS}] (the Qwen-Image pipeline's limit; it defaults to 512)",
        )
