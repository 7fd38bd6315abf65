"""PPO with a value head and GAE for autoregressive text tracks (Schulman et al., 2017,
"Proximal Policy Optimization Algorithms"; GAE: Schulman et al., 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation"; docs/math.md, "PPO").

Per loss token t of sequence i (the completion; the episode ends at its last token):

    r_t  = −β·k1_t + [t = last] · R_i                 k1_t = log π_old(y_t) − log π_ref(y_t)
    δ_t  = r_t + γ·V_old(t+1) − V_old(t)               V_old(last + 1) = 0
    Â_t  = δ_t + γλ·Â_{t+1},   G_t = Â_t + V_old(t)    (GAE(γ, λ) and the value target)
    L    = mean_t max(−Â_t r_t, −Â_t clip(r_t, 1 − ε_low, 1 + ε_high))
         + c_v · mean_t ½ max((V(t) − G_t)², (V_old(t) + clip(V(t) − V_old(t), ±ε_v) − G_t)²)

``R_i`` is the trainer's per-sample advantage (``advantage.std: none``, ``scope: global``:
the reward minus the batch mean); ``whiten`` normalises Â over every loss token of the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal, Protocol, runtime_checkable

import torch

from unirl.algorithms.base import StepResult
from unirl.algorithms.grpo import GRPO, TokenPolicy
from unirl.algorithms.kl import KLConfig
from unirl.algorithms.losses import aggregate, pad_packed
from unirl.algorithms.reinforcepp import batch_token_stats
from unirl.config.require import require
from unirl.config.typecheck import NonNegativeFloat, PositiveFloat
from unirl.types import Conditions, Packed, TextSegment


@runtime_checkable
class TokenValuePolicy(TokenPolicy, Protocol):
    """A token policy with a value head: ``token_values`` gives V(s_t), the value of the
    prefix before each loss token (the position that predicts it), 0 elsewhere."""

    def token_values(self, conditions: Conditions, segment: TextSegment) -> Packed:
        """Per-token values (fp32, the segment's offsets); differentiable under the caller's
        grad mode."""
        ...


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` by GAE(γ, λ) over each packed row's loss tokens, in order
    (the tokens off the mask are skipped, and get 0); the state after a row's last loss token
    is terminal (value 0). ``returns = advantages + values``."""
    adv = torch.zeros_like(rewards)
    for i in range(len(offsets) - 1):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        steps = [t for t in range(lo, hi) if bool(mask[t])]
        running = rewards.new_zeros(())
        next_value = rewards.new_zeros(())
        for t in reversed(steps):
            delta = rewards[t] + gamma * next_value - values[t]
            running = delta + gamma * lam * running
            adv[t] = running
            next_value = values[t]
    adv = torch.where(mask, adv, torch.zeros_like(adv))
    return adv, torch.where(mask, adv + values, torch.zeros_like(adv))


class PPO(GRPO):
    """PPO with a value head on the policy backbone and GAE(γ, λ) over the completion tokens.

    ``policy`` must provide ``token_values`` (a pipeline built with ``value_head: true``);
    ``gamma``: γ, the per-token discount (1: none); ``lam``: λ of GAE; ``vf_coef``: c_v, the
    value loss's weight; ``value_clip``: ε_v, how far V may move from V_old before its
    clipped loss takes over (null: unclipped); ``whiten``: normalise Â over every loss token of
    the batch; ``kl``: a :class:`~unirl.algorithms.kl.KLConfig` whose ``beta`` weighs the
    per-token k1 KL in the reward (needs LoRA's reference); ``clip_low`` / ``clip_high``:
    ε_low / ε_high of the ratio clip; ``adv_eps``: added to the std when whitening;
    ``old_logp_source``: ``replay`` or ``rollout``; ``loss_agg``: ``token-mean``."""

    kl_in_reward: ClassVar[bool] = True
    requires_value_head: ClassVar[bool] = True  # the validator asks for pipeline.value_head

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        gamma: NonNegativeFloat = 1.0,
        lam: NonNegativeFloat = 0.95,
        vf_coef: NonNegativeFloat = 0.5,
        value_clip: PositiveFloat | None = 0.2,
        whiten: bool = True,
        adv_eps: NonNegativeFloat = 1e-8,
        loss_agg: Literal["token-mean"] = "token-mean",
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: Literal["replay", "rollout"] = "replay",
    ) -> None:
        require(0.0 <= gamma <= 1.0, f"algorithm.gamma must be in [0, 1], got {gamma}")
        require(0.0 <= lam <= 1.0, f"algorithm.lam must be in [0, 1], got {lam}")
        require(vf_coef >= 0.0, f"algorithm.vf_coef must be >= 0, got {vf_coef}")
        require(
            value_clip is None or value_clip > 0,
            f"algorithm.value_clip must be > 0 or null, got {value_clip}",
        )
        require(adv_eps >= 0, f"algorithm.adv_eps must be >= 0, got {adv_eps}")
        require(
            old_logp_source in ("replay", "rollout"),
            "algorithm.old_logp_source=current has no π_old or V_old before training, where PPO "
            "takes GAE; set algorithm.old_logp_source=replay",
        )
        require(
            callable(getattr(policy, "token_values", None))
            and getattr(policy, "has_value_head", True),
            f"algorithm.policy ({type(policy).__name__}) has no value head: build the pipeline "
            "with pipeline.value_head=true",
        )
        super().__init__(
            policy=policy,
            clip_low=clip_low,
            clip_high=clip_high,
            loss_agg=loss_agg,
            kl=kl,
            old_logp_source=old_logp_source,
        )
        self.gamma, self.lam, self.vf_coef = gamma, lam, vf_coef
        self.value_clip, self.whiten, self.adv_eps = value_clip, whiten, adv_eps
        self._value_stats: dict[str, float] = {}

    def _values(self, conditions: Conditions, segment: TextSegment) -> torch.Tensor:
        out: Packed = self.policy.token_values(conditions, segment)  # type: ignore[attr-defined]
        return out.values.float()

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: TextSegment) -> TextSegment:
        """Anchor π_old; V_old; the KL part of each token's reward (−β·k1, zeros with β = 0)
        in ``token_advantages`` until :meth:`prepare_batch` runs GAE."""
        segment = super().prepare_segment(conditions, segment)
        assert segment.log_probs is not None
        old = segment.log_probs.values.float()
        mask = self._mask(segment, old)
        offsets = segment.tokens.offsets
        values = torch.where(mask, self._values(conditions, segment).to(old.device), 0.0)
        kl_reward = torch.zeros_like(old)
        control = self.kl_controller
        if control.enabled:
            with self.reference():
                ref = self._log_probs(conditions, segment).values.float().to(old.device)
            k1 = torch.where(mask, old - ref, torch.zeros_like(old))
            control.observe(k1[mask])
            kl_reward = -control.beta * k1
        return dataclasses.replace(
            segment,
            token_advantages=Packed(values=kl_reward, offsets=offsets),
            old_values=Packed(values=values, offsets=offsets),
        )

    def prepare_batch(
        self, micro: list[tuple[Conditions, TextSegment, torch.Tensor]]
    ) -> list[tuple[Conditions, TextSegment, torch.Tensor]]:
        """Each row's reward (its sample's advantage at its last loss token, plus the KL part),
        GAE(γ, λ) → Â and the value targets; Â whitened over the batch when ``whiten``."""
        staged = []
        for cond, seg, adv in micro:
            require(
                seg.token_advantages is not None and seg.old_values is not None,
                "PPO.prepare_batch needs segments anchored by its prepare_segment",
            )
            assert seg.token_advantages is not None and seg.old_values is not None  # required above
            mask = self._mask(seg, seg.token_advantages.values)
            rewards = seg.token_advantages.values.double().clone()
            offsets = seg.tokens.offsets
            for i in range(len(offsets) - 1):
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                last = [t for t in range(lo, hi) if bool(mask[t])]
                if last:
                    rewards[last[-1]] += float(adv[i])
            advantages, returns = gae(
                rewards, seg.old_values.values.double(), offsets, mask, self.gamma, self.lam
            )
            staged.append((cond, seg, adv, advantages, returns, mask))
        mean, std = 0.0, 1.0
        if self.whiten:
            mean, std = batch_token_stats([(a, m) for *_, a, _, m in staged])
            std = std + self.adv_eps
        out = []
        for cond, seg, adv, advantages, returns, mask in staged:
            norm = torch.where(mask, (advantages - mean) / std, torch.zeros_like(advantages))
            out.append(
                (
                    cond,
                    dataclasses.replace(
                        seg,
                        token_advantages=Packed(values=norm.float(), offsets=seg.tokens.offsets),
                        value_targets=Packed(values=returns.float(), offsets=seg.tokens.offsets),
                    ),
                    adv,
                )
            )
        return out

    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: TextSegment,
        advantages: torch.Tensor,
        loss_scale: float,
    ) -> StepResult:
        """The clipped policy loss (GRPO's, on Â), then c_v times the clipped value loss,
        each aggregated per token and backpropagated."""
        result = super().compute_loss_and_backward(conditions, segment, advantages, loss_scale)
        if segment.value_targets is None or segment.old_values is None:
            raise ValueError("PPO needs value targets; call prepare_segment and prepare_batch")
        values = self._values(conditions, segment)
        device = values.device
        mask = self._mask(segment, values)
        old = segment.old_values.values.float().to(device)
        target = segment.value_targets.values.float().to(device)
        values = torch.where(mask, values, torch.zeros_like(values))
        terms = (values - target).square()
        if self.value_clip is not None:
            clipped = old + (values - old).clamp(-self.value_clip, self.value_clip)
            terms = torch.maximum(terms, (clipped - target).square())
        terms = 0.5 * terms
        offsets = segment.tokens.offsets
        vf_loss = aggregate(
            pad_packed(terms, offsets), pad_packed(mask, offsets, False), self.loss_agg
        )
        (self.vf_coef * vf_loss * loss_scale).backward()
        result.terms["value_loss"] = terms.detach()[mask]
        result.terms["value_error"] = (values - target).detach()[mask]
        loss = result.loss + (self.vf_coef * vf_loss * loss_scale).detach()
        return StepResult(loss=loss, terms=result.terms)

    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        out = super().summarize(terms)
        if "value_loss" in terms and terms["value_loss"].numel():
            out["value_loss"] = float(terms["value_loss"].mean())
            out["value/abs_error"] = float(terms["value_error"].abs().mean())
        return out
