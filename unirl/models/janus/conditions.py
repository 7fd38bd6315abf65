"""What Janus's image stage samples with, what the driver asks of it, and what its replay reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl.config.require import require
from unirl.config.typecheck import NonNegativeFloat, PositiveInt
from unirl.models.common_ar.conditions import PromptConditions
from unirl.types import TextRequest, batch_field
from unirl.types.rollout import noise_seed

IMAGE_TOKEN_STREAM = "image_tokens"


@dataclass(kw_only=True)
class ImageTokenSamplingParams:
    """How Janus draws an image: ``guidance_scale`` (classifier-free guidance on the image-token
    logits, ``uncond + w·(cond - uncond)``; 1: the conditional logits alone), ``temperature``
    (the policy is ``softmax(guided / temperature)``; 0: greedy), ``eval_temperature`` (eval
    rollouts), ``samples_per_prompt`` (1 in think-then-draw: one image per written plan),
    ``top_k`` / ``top_p`` (truncate each draw after guidance and temperature, as transformers'
    image generation does; -1 / 1.0: off; the recorded log-probs stay the untruncated
    policy's, as for text). The number of tokens is the model's
    (``vision_config.num_image_tokens``, 576 at 384 px)."""

    guidance_scale: float = 5.0
    temperature: NonNegativeFloat = 1.0
    eval_temperature: NonNegativeFloat = 1.0
    samples_per_prompt: PositiveInt = 1
    top_k: int = -1
    top_p: float = 1.0

    def __post_init__(self) -> None:
        require(
            self.guidance_scale >= 1.0,
            f"unified.image.sampling.guidance_scale={self.guidance_scale} must be >= 1 "
            "(1: no guidance; Janus-Pro's default is 5)",
        )
        require(self.temperature >= 0, "unified.image.sampling.temperature must be >= 0")
        require(
            self.top_k == -1 or self.top_k >= 1,
            f"unified.image.sampling.top_k={self.top_k} must be -1 (off) or >= 1",
        )
        require(
            0.0 < self.top_p <= 1.0,
            f"unified.image.sampling.top_p={self.top_p} must be in (0, 1] (1.0: off)",
        )

    def temperature_for(self, mode: str) -> float:
        return self.eval_temperature if mode == "eval" else self.temperature

    def dry_run_fields(self) -> dict[str, object]:
        return {
            "guidance_scale": self.guidance_scale,
            "temperature": self.temperature,
            "samples_per_prompt": self.samples_per_prompt,
            "top_k": self.top_k,
            "top_p": self.top_p,
        }


@dataclass(kw_only=True)
class ImageTokenRequest(TextRequest):
    """The image stage's part of a request: a :class:`TextRequest` (seed ids, temperature;
    ``max_new_tokens`` = the model's image tokens; ``top_k`` / ``top_p`` truncate the draw)
    plus ``guidance_scale`` (shared). Its uniforms come from their own stream, so an image's
    draws are independent of the text sample of the same id; :meth:`batch_seed` seeds the
    one generator of ``JanusImagePipeline(rng="batch")``."""

    stream: ClassVar[str] = IMAGE_TOKEN_STREAM

    guidance_scale: float = batch_field("shared", default=1.0)

    def uniforms(self, seed: int, steps: int | None = None) -> torch.Tensor:
        steps = self.max_new_tokens if steps is None else steps
        out = torch.empty((len(self.seed_ids), steps), dtype=torch.float64)
        gen = torch.Generator(device="cpu")
        for row, seed_id in enumerate(self.seed_ids.tolist()):
            gen.manual_seed(noise_seed(seed, int(seed_id), self.stream))
            out[row] = torch.rand(steps, generator=gen, dtype=torch.float64)
        return out

    def batch_seed(self, seed: int) -> int:
        """The seed of the shard's one generator under ``rng: batch``: ``(seed, the first seed
        id)`` on a stream of its own, so shards (their first ids differ) draw different
        numbers and a shard's draws repeat when it is sampled again."""
        require(len(self.seed_ids) > 0, "ImageTokenRequest.batch_seed needs at least one seed id")
        return noise_seed(seed, int(self.seed_ids[0]), f"{self.stream}/batch")


@dataclass(kw_only=True)
class ImageTokenConditions(PromptConditions):
    """An image track's replay inputs: ``prompt_lengths[N]`` (the context tokens at the start of
    each packed row: prompt, written plan, ``<begin_of_image>``; the image tokens follow),
    ``temperature`` and ``guidance_scale`` (shared) of the policy
    ``softmax((uncond + w·(cond - uncond)) / temperature)``."""

    guidance_scale: float = batch_field("shared", default=1.0)


__all__ = [
    "IMAGE_TOKEN_STREAM",
    "ImageTokenConditions",
    "ImageTokenRequest",
    "ImageTokenSamplingParams",
]
