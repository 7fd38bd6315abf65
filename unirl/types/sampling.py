"""Sampling parameters pinned on a request (shared by every sample of the batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl.config.require import require
from unirl.config.typecheck import NonNegativeFloat, PositiveFloat, PositiveInt


@dataclass(kw_only=True)
class DiffusionSamplingParams:
    """How a diffusion engine samples one rollout.

    ``eta`` is the SDE noise level of the recipe's strategy; ``sde_steps`` is an SDE-step
    schedule object (``unirl.sde.AllSteps`` …) choosing which steps are stochastic and trained.
    ``num_frames`` and ``fps`` are read by video families (images: ``num_frames=1``).
    """

    num_inference_steps: PositiveInt = 10
    guidance_scale: NonNegativeFloat = 4.5
    height: PositiveInt = 512
    width: PositiveInt = 512
    eta: NonNegativeFloat = 0.7
    samples_per_prompt: PositiveInt = 8
    sde_steps: Any = None
    max_sequence_length: PositiveInt = 256
    negative_prompt: str = ""
    eval_num_inference_steps: PositiveInt = 40
    eval_guidance_scale: NonNegativeFloat | None = None
    num_frames: PositiveInt = 1
    fps: PositiveFloat = 16.0

    def __post_init__(self) -> None:
        require(self.num_inference_steps >= 1, "sampling.num_inference_steps must be >= 1")
        require(
            self.guidance_scale >= 0, "sampling.guidance_scale must be >= 0 (1 or 0 disables CFG)"
        )
        require(
            self.height > 0 and self.width > 0, "sampling.height and sampling.width must be > 0"
        )
        require(self.eta >= 0, "sampling.eta (SDE noise level) must be >= 0")
        require(self.samples_per_prompt >= 1, "sampling.samples_per_prompt must be >= 1")
        require(self.num_frames >= 1, "sampling.num_frames must be >= 1 (1 for images)")
        require(self.fps > 0, "sampling.fps must be > 0")
        require(self.max_sequence_length >= 1, "sampling.max_sequence_length must be >= 1")
        require(
            self.eval_num_inference_steps >= 1, "sampling.eval_num_inference_steps must be >= 1"
        )
        require(
            self.eval_guidance_scale is None or self.eval_guidance_scale >= 0,
            "sampling.eval_guidance_scale must be >= 0 or null (null: the training guidance_scale)",
        )

    def guidance_for(self, mode: str) -> float:
        """The CFG scale of a ``train`` or ``eval`` request: ``eval_guidance_scale`` when set
        (0 included: it disables CFG), else ``guidance_scale``."""
        if mode == "eval" and self.eval_guidance_scale is not None:
            return self.eval_guidance_scale
        return self.guidance_scale


@dataclass(kw_only=True)
class ARSamplingParams:
    """Autoregressive sampling: ``n`` completions per prompt."""

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 8
    stop: list[str] | None = None

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, "sampling.max_new_tokens must be >= 1")
        require(self.temperature >= 0, "sampling.temperature must be >= 0")
        require(0 < self.top_p <= 1, "sampling.top_p must be in (0, 1]")
        require(self.top_k == -1 or self.top_k >= 1, "sampling.top_k must be -1 (off) or >= 1")
        require(self.n >= 1, "sampling.n must be >= 1")
