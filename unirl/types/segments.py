"""Trajectory segments: what a rollout records so training can replay it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from unirl.types.batch import Batch, Packed, batch_field


@dataclass(kw_only=True)
class LatentSegment(Batch):
    """A diffusion trajectory stored sparsely: only the ``S`` SDE steps an algorithm trains.

    ``sigmas[T+1]`` is the full schedule; ``sde_indices[N, S]`` the trained step indices
    (identical within a group). For trained step ``k`` of sample ``i``: ``latents[i, k]`` is
    x at σ = ``sigmas[sde_indices[i, k]]`` and ``next_latents[i, k]`` the sampled x one step
    later, both in the storage dtype. ``sde_logp[N, S]`` (fp32, mean over C·H·W) and
    ``sde_means[N, S, C, h, w]`` are recorded when the strategy provides them.
    ``final_latents[N, C, h, w]`` is the clean sample x₀ (decode, NFT).
    ``sde_uncond[N, S, C, h, w]`` (fp32, ``pipeline.record_uncond``) is the
    unconditional velocity v_u the sampler computed at each trained step, and
    ``uncond_version`` the policy version it was computed at (-1: unknown, never reused).

    ``sigmas`` and ``sde_indices`` are schedule metadata: they stay on the host through
    :meth:`to`, so indexing them never waits on the device queue (the σ values a step needs
    are gathered on the host and copied over asynchronously).
    """

    host_fields: ClassVar[tuple[str, ...]] = ("sigmas", "sde_indices")

    sigmas: torch.Tensor = batch_field("shared")
    sde_indices: torch.Tensor = batch_field("concat")
    latents: torch.Tensor | None = batch_field("concat", default=None)
    next_latents: torch.Tensor | None = batch_field("concat", default=None)
    final_latents: torch.Tensor | None = batch_field("concat", default=None)
    sde_logp: torch.Tensor | None = batch_field("concat", default=None)
    sde_means: torch.Tensor | None = batch_field("concat", default=None)
    sde_uncond: torch.Tensor | None = batch_field("concat", default=None)
    guidance_scale: float = batch_field("shared", default=1.0)
    uncond_version: int = batch_field("shared", default=-1)
    strategy: str = batch_field("shared", default="flow")

    def __post_init__(self) -> None:
        if self.sde_indices.ndim != 2:
            raise ValueError(
                f"LatentSegment.sde_indices must be [N, S], got {tuple(self.sde_indices.shape)}"
            )
        n, s = self.sde_indices.shape
        for name in ("latents", "next_latents", "sde_means", "sde_uncond"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape[:2]) != (n, s):
                raise ValueError(
                    f"LatentSegment.{name} must start with [N={n}, S={s}], got {tuple(t.shape)}"
                )
        if self.sde_logp is not None and tuple(self.sde_logp.shape) != (n, s):
            raise ValueError(
                f"LatentSegment.sde_logp must be [N={n}, S={s}], got {tuple(self.sde_logp.shape)}"
            )
        if self.sde_indices.numel() and int(self.sde_indices.max()) >= self.sigmas.numel() - 1:
            raise ValueError("LatentSegment.sde_indices point past the last step of sigmas")

    @property
    def num_sde_steps(self) -> int:
        return int(self.sde_indices.shape[1])


@dataclass(kw_only=True)
class TextSegment(Batch):
    """An AR trajectory: packed ``tokens`` (prompt and completion of each sample),
    per-token ``log_probs`` and ``loss_mask`` (true on the completion tokens a loss trains).

    ``log_probs`` is what the engine recorded until the algorithm anchors π_old
    (``prepare_segment``); then it holds the anchor, and ``rollout_log_probs`` keeps the
    engine's values when a loss still needs them (truncated importance sampling).
    ``token_advantages``: per-token advantages a loss computes itself before training
    (REINFORCE++'s KL-shaped, batch-normalised return); absent, a loss broadcasts the
    sample's advantage to its tokens. ``old_values`` / ``value_targets``: a value head's
    V_old per token and its GAE targets (PPO).
    """

    tokens: Packed = batch_field("packed")
    log_probs: Packed | None = batch_field("packed", default=None)
    loss_mask: Packed | None = batch_field("packed", default=None)
    rollout_log_probs: Packed | None = batch_field("packed", default=None)
    token_advantages: Packed | None = batch_field("packed", default=None)
    old_values: Packed | None = batch_field("packed", default=None)
    value_targets: Packed | None = batch_field("packed", default=None)

    def __post_init__(self) -> None:
        for name in (
            "log_probs",
            "loss_mask",
            "rollout_log_probs",
            "token_advantages",
            "old_values",
            "value_targets",
        ):
            p = getattr(self, name)
            if p is not None and not torch.equal(p.offsets, self.tokens.offsets):
                raise ValueError(f"TextSegment.{name} offsets must match tokens offsets")
