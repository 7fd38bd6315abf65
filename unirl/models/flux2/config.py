"""``Flux2KleinBundleConfig``: what a recipe's ``bundle:`` block may set for FLUX.2-Klein."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.bundle import FlowMatchingBundleConfig


@dataclass(kw_only=True)
class Flux2KleinBundleConfig(FlowMatchingBundleConfig):
    """FLUX.2-Klein weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` | ``flux2-klein-arch`` | a local diffusers folder | a hub id
    (``black-forest-labs/FLUX.2-klein-4B``; a ``-base-`` checkpoint is the undistilled one,
    sampled with classifier-free guidance). ``text_encoder_dtype`` is the Qwen3 encoder's
    precision. ``max_sequence_length`` is the prompt length in tokens, chat template
    included: every prompt is padded (or cut) to exactly this many tokens, as the FLUX.2
    pipelines do (their default is 512), so it sets the text half of every transformer call.
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny", "flux2-klein-arch")

    max_sequence_length: PositiveInt = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            isinstance(self.max_sequence_length, int) and self.max_sequence_length >= 1,
            f"bundle.max_sequence_length={self.max_sequence_length!r} must be an integer >= 1 "
            "(prompt tokens, chat template included; the FLUX.2 pipelines use 512)",
        )
