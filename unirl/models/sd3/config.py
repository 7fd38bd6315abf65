"""``SD3BundleConfig``: what a recipe's ``bundle:`` block may set for SD3 / SD3.5."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.models.common.bundle import SDPA_BACKENDS, FlowMatchingBundleConfig

T5_PLACEHOLDERS = ("zeros", "random")

__all__ = ["SDPA_BACKENDS", "T5_PLACEHOLDERS", "SD3BundleConfig"]


@dataclass(kw_only=True)
class SD3BundleConfig(FlowMatchingBundleConfig):
    """SD3 / SD3.5 weights and how they are held (the shared fields: see
    :class:`~unirl.models.common.bundle.FlowMatchingBundleConfig`).

    ``path``: ``tiny`` | ``sd3.5-medium-arch`` | a local diffusers folder | a hub id.
    ``max_sequence_length`` is the T5 token count (joint sequence = 77 CLIP + this).
    ``skip_t5`` does not load T5 at all and fills its part of the sequence with
    ``t5_placeholder`` embeddings: ``zeros`` (what diffusers does without ``text_encoder_3``)
    or ``random`` (fixed per prompt; for benchmarks of the arch preset).
    ``compile_vae``: on an H100 16 SD3.5 latents decode in 0.133 s instead of 0.240 s, after
    a ~28 s compile.
    ``fuse_projections`` computes each attention's q / k / v projections (and the LoRA ``A``
    of adapters on them) as one matmul (``unirl/models/sd3/attention.py``); the math is that
    of diffusers' processor, the summation order inside the matmul differs.
    ``graph_text_encoders`` (CUDA only) replays the CLIP-L, CLIP-G and T5 forwards from one
    CUDA graph per prompt count (captured on first use; tokenisation stays on the host):
    over the one or two prompts of a rollout those forwards are launch-bound. The embeddings
    are bit-identical to the eager ones (``tests/models/test_cuda_graph.py``, GPU).
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny", "sd3.5-medium-arch")

    max_sequence_length: PositiveInt = 256
    skip_t5: bool = False
    t5_placeholder: str = "zeros"
    fuse_projections: bool = True
    graph_text_encoders: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            1 <= self.max_sequence_length <= 512,
            f"bundle.max_sequence_length={self.max_sequence_length} must be in [1, 512] (SD3 was trained "
            "with 77 CLIP + up to 256 T5 tokens; recipes use 128 or 256)",
        )
        require(
            self.t5_placeholder in T5_PLACEHOLDERS,
            f"bundle.t5_placeholder={self.t5_placeholder!r} must be one of {T5_PLACEHOLDERS}",
        )
