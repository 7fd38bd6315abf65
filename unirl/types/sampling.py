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
    """Denoising steps of a training rollout."""
    guidance_scale: NonNegativeFloat = 4.5
    """Classifier-free guidance scale of training rollouts (at most 1: no CFG, one forward per
    step)."""
    height: PositiveInt = 512
    """Image height in pixels (a multiple of the family's VAE factor × patch size)."""
    width: PositiveInt = 512
    """Image width in pixels (a multiple of the family's VAE factor × patch size)."""
    eta: NonNegativeFloat = 0.7
    samples_per_prompt: PositiveInt = 8
    """Samples drawn per prompt: the group whose rewards give the group-relative advantages."""
    sde_steps: Any = None
    max_sequence_length: PositiveInt = 256
    """Text tokens per prompt; recipes pass it on to their bundle
    (``bundle.max_sequence_length: ${sampling.max_sequence_length}``); the sampler does not
    read it."""
    negative_prompt: str = ""
    """The unconditional (negative) text of CFG; engines pass it to the bundle on every guided
    rollout, so it is used instead of ``bundle.negative_prompt``."""
    eval_num_inference_steps: PositiveInt = 40
    """Denoising steps of an eval rollout (ODE sampling)."""
    eval_guidance_scale: NonNegativeFloat | None = None
    """CFG scale of eval rollouts (null: ``guidance_scale``; 1 or less, 0 included: no CFG)."""
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
    """How an autoregressive engine samples one rollout: ``samples_per_prompt`` completions
    per prompt, each at most ``max_new_tokens`` long, ending at an end-of-sequence token or
    at one of the ``stop`` strings (kept in the completion).

    ``temperature`` scales the logits (0: greedy); ``top_p`` / ``top_k`` (1.0 / -1: off)
    truncate the distribution a token is drawn from. The policy the trainer replays is the
    temperature-scaled distribution without the truncation (see
    ``unirl/models/common_ar/README.md``). ``eval_temperature`` is the temperature of eval
    rollouts (default 0: greedy); eval uses the same ``max_new_tokens`` and ``stop``.
    """

    max_new_tokens: PositiveInt = 512
    temperature: NonNegativeFloat = 1.0
    top_p: PositiveFloat = 1.0
    top_k: int = -1
    samples_per_prompt: PositiveInt = 8
    stop: list[str] | None = None
    eval_temperature: NonNegativeFloat = 0.0

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, "sampling.max_new_tokens must be >= 1")
        require(self.temperature >= 0, "sampling.temperature must be >= 0 (0: greedy)")
        require(0 < self.top_p <= 1, "sampling.top_p must be in (0, 1] (1: off)")
        require(self.top_k == -1 or self.top_k >= 1, "sampling.top_k must be -1 (off) or >= 1")
        require(self.samples_per_prompt >= 1, "sampling.samples_per_prompt must be >= 1")
        require(self.eval_temperature >= 0, "sampling.eval_temperature must be >= 0 (0: greedy)")
        if self.stop is not None:
            self.stop = [str(s) for s in self.stop]
            require(
                all(self.stop),
                "sampling.stop: stop strings must be non-empty (or set stop: null)",
            )

    def temperature_for(self, mode: str) -> float:
        """The temperature of a ``train`` or ``eval`` request."""
        return self.eval_temperature if mode == "eval" else self.temperature

    def dry_run_fields(self) -> dict[str, object]:
        """What ``dry_run`` prints beside the batch geometry."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": list(self.stop or []),
            "eval_temperature": self.eval_temperature,
        }
