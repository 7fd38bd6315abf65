"""``SD3BundleConfig``: what a recipe's ``bundle:`` block may set for SD3 / SD3.5."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.config import require
from unirl.config.precision import canonical_precision

SDPA_BACKENDS = ("auto", "torch", "flash", "efficient", "cudnn", "math")
T5_PLACEHOLDERS = ("zeros", "random")


@dataclass(kw_only=True)
class SD3BundleConfig:
    """SD3 / SD3.5 weights and how they are held.

    ``path``: ``tiny`` | ``sd3.5-medium-arch`` | a local diffusers folder | a hub id.
    ``dtype`` is the trainable transformer's precision; ``text_encoder_dtype`` and
    ``vae_dtype`` are the frozen parts'. ``device``: ``auto`` (the current CUDA device if
    there is one, else CPU), ``cpu``, ``cuda``, ``cuda:N``.
    ``max_sequence_length`` is the T5 token count (joint sequence = 77 CLIP + this).
    ``skip_t5`` does not load T5 at all and fills its part of the sequence with
    ``t5_placeholder`` embeddings: ``zeros`` (what diffusers does without ``text_encoder_3``)
    or ``random`` (fixed per prompt; for benchmarks of the arch preset).
    ``sdpa_backend`` picks the attention kernel on CUDA: ``auto`` puts cuDNN's fused attention
    first on Hopper and newer (then flash, memory-efficient, math) and leaves older cards to
    PyTorch; ``torch`` is PyTorch's own order; ``flash`` / ``efficient`` / ``cudnn`` / ``math``
    pin one kernel. CPU always uses PyTorch's choice.
    ``decode_chunk_size`` bounds how many latents one VAE decode call takes.
    ``compile_vae`` compiles the VAE decoder with ``torch.compile`` (one graph per chunk
    shape; on an H100 16 SD3.5 latents decode in 0.133 s instead of 0.240 s, after a ~28 s
    compile).
    ``fuse_projections`` computes each attention's q / k / v projections (and the LoRA ``A``
    of adapters on them) as one matmul (``unirl/models/sd3/attention.py``); the math is that
    of diffusers' processor, the summation order inside the matmul differs.
    """

    path: str = "tiny"
    dtype: str = "bf16"
    text_encoder_dtype: str = "bf16"
    vae_dtype: str = "fp32"
    device: str = "auto"
    max_sequence_length: int = 256
    skip_t5: bool = False
    t5_placeholder: str = "zeros"
    negative_prompt: str = ""
    gradient_checkpointing: bool = False
    sdpa_backend: str = "auto"
    decode_chunk_size: int = 8
    compile_vae: bool = False
    fuse_projections: bool = True

    def __post_init__(self) -> None:
        require(
            isinstance(self.path, str) and self.path.strip() != "",
            "bundle.path must name a preset (tiny, sd3.5-medium-arch), a local folder or a hub id",
        )
        self.dtype = canonical_precision(self.dtype, "bundle.dtype")
        self.text_encoder_dtype = canonical_precision(
            self.text_encoder_dtype, "bundle.text_encoder_dtype"
        )
        self.vae_dtype = canonical_precision(self.vae_dtype, "bundle.vae_dtype")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                require(
                    False,
                    f"bundle.device={self.device!r} is not a device ({exc}); use auto, cpu, cuda or cuda:N",
                )
        require(
            1 <= self.max_sequence_length <= 512,
            f"bundle.max_sequence_length={self.max_sequence_length} must be in [1, 512] (SD3 was trained "
            "with 77 CLIP + up to 256 T5 tokens; recipes use 128 or 256)",
        )
        require(
            self.t5_placeholder in T5_PLACEHOLDERS,
            f"bundle.t5_placeholder={self.t5_placeholder!r} must be one of {T5_PLACEHOLDERS}",
        )
        require(
            self.sdpa_backend in SDPA_BACKENDS,
            f"bundle.sdpa_backend={self.sdpa_backend!r} must be one of {SDPA_BACKENDS}",
        )
        require(
            self.decode_chunk_size >= 1,
            f"bundle.decode_chunk_size={self.decode_chunk_size} must be >= 1",
        )

    def resolved_device(self) -> torch.device:
        """``device`` as a ``torch.device``; ``auto`` picks the current CUDA device or CPU."""
        if self.device == "auto":
            return (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        return torch.device(self.device)
