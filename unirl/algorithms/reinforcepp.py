"""REINFORCE++ for autoregressive text tracks (Hu et al., 2025, "REINFORCE++: An Efficient
RLHF Algorithm with Robustness to Both Prompt and Reward Models"; docs/math.md, "REINFORCE++").

    k1_t = log π_old(y_t) − log π_ref(y_t)                      (per loss token)
    G_t  = A_i − β · Σ_{s ≥ t} k1_s                             (the KL-shaped return, γ = 1)
    Â_t  = (G_t − mean G) / (std G + eps)                      (over every loss token of the batch)
    ℓ_t  = max(−Â_t r_t, −Â_t clip(r_t, 1 − ε_low, 1 + ε_high))

``A_i`` is the advantage the trainer hands over (``advantage.std: none``: the reward minus a
baseline, which the batch normalisation makes irrelevant for ``scope: global`` and turns into
the paper's "REINFORCE++-baseline" for ``scope: group``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal

import torch

from unirl.algorithms.grpo import GRPO, TokenPolicy
from unirl.algorithms.kl import KLConfig
from unirl.config.require import require
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import Conditions, Packed, TextSegment


def kl_to_go(k1: torch.Tensor, offsets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Σ_{s ≥ t} k1_s`` within each packed row, over loss tokens only (0 off the mask)."""
    out = torch.zeros_like(k1)
    terms = torch.where(mask, k1, torch.zeros_like(k1))
    for i in range(len(offsets) - 1):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        if hi > lo:
            out[lo:hi] = torch.flip(torch.cumsum(torch.flip(terms[lo:hi], [0]), 0), [0])
    return torch.where(mask, out, torch.zeros_like(out))


def batch_token_stats(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """Mean and population std of ``values[mask]`` over every ``(values, mask)`` part, summed
    over the ranks when torch.distributed is up (every rank gets the same two numbers)."""
    device = parts[0][0].device if parts else torch.device("cpu")
    stats = torch.zeros(3, dtype=torch.float64, device=device)
    for values, mask in parts:
        v = values.double()[mask]
        stats += torch.stack([v.sum(), v.square().sum(), v.new_tensor(float(v.numel()))])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(stats)
    total, square, count = stats.tolist()
    if not count:
        return 0.0, 0.0
    mean = total / count
    return mean, max(square / count - mean * mean, 0.0) ** 0.5


class ReinforcePP(GRPO):
    """REINFORCE++: the per-token KL to the reference folded into the reward, the return
    normalised over every loss token of the rollout batch (not per group), PPO's clip.

    ``kl``: a :class:`~unirl.algorithms.kl.KLConfig` whose ``beta`` weighs the per-token k1
    KL in the reward, not a loss term (``kl.beta > 0`` needs the reference: LoRA; an
    adaptive β follows the mean k1 of the rollout); ``clip_low``: ε_low of PPO's token-ratio
    clip; ``clip_high``: ε_high; ``adv_eps``: added to the batch std of the returns;
    ``old_logp_source``: ``replay`` or ``rollout`` (the KL is taken at π_old before training,
    so not ``current``); ``loss_agg``, ``norm_length``, ``tis_cap``: as GRPO."""

    kl_in_reward: ClassVar[bool] = True

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        adv_eps: float = 1e-8,
        loss_agg: str = "token-mean",
        norm_length: int | None = None,
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: Literal["replay", "rollout"] = "replay",
        tis_cap: float | None = None,
    ) -> None:
        require(adv_eps >= 0, f"algorithm.adv_eps must be >= 0, got {adv_eps}")
        require(
            old_logp_source in ("replay", "rollout"),
            "algorithm.old_logp_source=current has no π_old before training, where REINFORCE++ "
            "takes its KL-shaped returns; set algorithm.old_logp_source=replay",
        )
        super().__init__(
            policy=policy,
            clip_low=clip_low,
            clip_high=clip_high,
            loss_agg=loss_agg,
            norm_length=norm_length,
            kl=kl,
            old_logp_source=old_logp_source,
            tis_cap=tis_cap,
        )
        self.adv_eps = adv_eps
        self._return_stats: dict[str, float] = {}

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: TextSegment) -> TextSegment:
        """Anchor π_old, then store ``−β · Σ_{s ≥ t} k1_s`` per token in ``token_advantages``
        (zeros with β = 0); :meth:`prepare_batch` adds the sample's advantage and normalises."""
        segment = super().prepare_segment(conditions, segment)
        assert segment.log_probs is not None  # anchored above (source replay or rollout)
        old = segment.log_probs.values.float()
        mask = self._mask(segment, old)
        offsets = segment.tokens.offsets
        shaped = torch.zeros_like(old)
        control = self.kl_controller
        if control.enabled:
            with self.reference():
                ref = self._log_probs(conditions, segment).values.float().to(old.device)
            k1 = torch.where(mask, old - ref, torch.zeros_like(old))
            control.observe(k1[mask])
            shaped = -control.beta * kl_to_go(k1, offsets.to(old.device), mask)
        return dataclasses.replace(segment, token_advantages=Packed(values=shaped, offsets=offsets))

    def prepare_batch(
        self, micro: list[tuple[Conditions, TextSegment, torch.Tensor]]
    ) -> list[tuple[Conditions, TextSegment, torch.Tensor]]:
        """``G_t = A_i + shaped_t``, then ``(G − mean G) / (std G + adv_eps)`` with the mean and
        (population) std over every loss token of every micro-batch and every rank."""
        returns, masks = [], []
        for _, seg, adv in micro:
            require(
                seg.token_advantages is not None,
                "ReinforcePP.prepare_batch needs segments anchored by its prepare_segment",
            )
            assert seg.token_advantages is not None  # required above
            lengths = (seg.tokens.offsets[1:] - seg.tokens.offsets[:-1]).to(adv.device)
            shaped = seg.token_advantages.values.double()
            g = torch.repeat_interleave(adv.double(), lengths).to(shaped.device) + shaped
            returns.append(g)
            masks.append(self._mask(seg, g))
        mean, std = batch_token_stats(list(zip(returns, masks, strict=True)))
        self._return_stats = {"returns/mean": mean, "returns/std": std}
        out = []
        for (cond, seg, adv), g, m in zip(micro, returns, masks, strict=True):
            norm = torch.where(m, (g - mean) / (std + self.adv_eps), torch.zeros_like(g))
            values = norm.float()
            packed = Packed(values=values, offsets=seg.tokens.offsets)
            out.append((cond, dataclasses.replace(seg, token_advantages=packed), adv))
        return out

    @distributed(dispatch=Dispatch.BROADCAST)
    def after_train(self, rollout_index: int) -> dict[str, float]:
        """GRPO's (KL controller: ``kl/rollout_mean`` is the mean k1 of the reward), plus the
        batch mean and std of the KL-shaped returns before normalisation."""
        return {**super().after_train(rollout_index), **self._return_stats}
