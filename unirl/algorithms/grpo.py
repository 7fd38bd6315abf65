"""Token-level GRPO and GSPO for autoregressive text tracks (docs/math.md, "AR GRPO, DRPO, GSPO
 and Dr. GRPO").

    r_t = exp(log π_θ(y_t) − log π_old(y_t)),  ℓ_t = max(−A·r_t, −A·clip(r_t, 1 − ε_low, 1 + ε_high))
    L = aggregate(ℓ + β·k3(π_θ, π_ref), loss_mask, mode)

``TokenPolicyLoss`` holds everything a per-token ratio loss on a ``TextSegment`` needs
(anchoring π_old, the reference KL, packing, aggregation, metrics, the rollout-vs-trainer
log-prob gap and its truncated importance-sampling correction); ``GRPO`` and ``DRPO`` only
say how a token's loss follows from its ratio.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Mapping
from typing import ClassVar, Protocol, runtime_checkable

import torch

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.kl import KLConfig
from unirl.algorithms.losses import (
    LOSS_AGG_MODES,
    aggregate,
    clipped_surrogate,
    grpo_clip_loss,
    k3_kl,
    pad_packed,
)
from unirl.config.require import require
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import Conditions, Packed, TextSegment


@runtime_checkable
class TokenPolicy(Protocol):
    """What a text-track loss needs from the model side (see README.md, "the policy protocol")."""

    def token_log_probs(self, conditions: Conditions, segment: TextSegment) -> Packed:
        """Per-token log π(y_t | y_<t, conditions) under the current weights: a ``Packed`` with
        ``segment.tokens.offsets``; differentiable under the caller's grad mode."""
        ...


class TokenPolicyLoss(StageAlgorithm[TextSegment]):
    """Base of the per-token ratio losses on ``TextSegment`` (packed tokens).

    ``old_logp_source``: ``replay`` recomputes π_old with ``policy.token_log_probs`` at the
    training micro-batch geometry before any update (first ratio exactly 1); ``rollout``
    trusts ``segment.log_probs`` from the engine (vLLM / SGLang numerics differ from the
    trainer's, so ratios start ≠ 1); ``current`` takes π_old from the loss forward itself
    (detached): with one optimizer step per rollout (``stack.num_updates_per_batch=1``, which
    the stack checks) every micro-batch's forward runs the weights that sampled, so that
    forward *is* the replay and the no-grad replay pass is skipped (ratio exactly 1 as with
    ``replay``; the rollout-vs-trainer gap is measured on that forward). ``loss_agg``: see :func:`unirl.algorithms.losses.aggregate`;
    ``norm_length`` is the constant divisor of ``seq-mean-token-sum-norm``.
    ``kl.beta > 0`` (``kl``: a :class:`~unirl.algorithms.kl.KLConfig`) adds β·k3 to the frozen
    reference (the policy under ``reference()``); an adaptive β follows the mean k3 of the
    loss tokens.
    Advantages are per sample (``[B]``), broadcast to every token of the sample, unless the
    segment carries ``token_advantages`` (a loss that computes its own per token, REINFORCE++).
    A subclass with ``kl_in_reward`` puts the β-weighted KL in the reward, not the loss.

    The rollout-vs-trainer gap: when the segment arrives with recorded log-probs, π_old is
    also replayed (it is the anchor with ``replay``; with ``rollout`` one extra no-grad
    forward per micro-batch) and ``after_train`` reports ``rollout/logp_gap`` (mean
    |recorded − replayed| per loss token) and ``rollout/logp_gap_max``. ``tis_cap`` (C, needs
    ``replay``) corrects that gap with truncated importance sampling: each token's policy
    loss is weighted by ``min(π_old(y) / π_rollout(y), C)`` (detached).
    """

    kl_in_reward: ClassVar[bool] = False  # REINFORCE++: β·KL shapes the reward, no loss term

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        loss_agg: str = "token-mean",
        norm_length: int | None = None,
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: str = "replay",
        tis_cap: float | None = None,
    ) -> None:
        super().__init__(kl=kl)
        require(
            loss_agg in LOSS_AGG_MODES,
            f"algorithm.loss_agg must be one of {list(LOSS_AGG_MODES)}, got {loss_agg!r}",
        )
        require(
            loss_agg != "seq-mean-token-sum-norm" or (norm_length is not None and norm_length > 0),
            "algorithm.loss_agg=seq-mean-token-sum-norm needs algorithm.norm_length > 0 "
            "(the constant divisor; use the generation budget max_new_tokens)",
        )
        require(
            old_logp_source in ("replay", "rollout", "current"),
            f"algorithm.old_logp_source must be 'replay', 'rollout' or 'current', got "
            f"{old_logp_source!r}",
        )
        require(
            callable(getattr(policy, "token_log_probs", None)),
            f"algorithm.policy ({type(policy).__name__}) must provide token_log_probs(conditions, segment)",
        )
        require(
            tis_cap is None or tis_cap > 0,
            f"algorithm.tis_cap must be > 0 (the importance-weight cap C) or null, got {tis_cap}",
        )
        require(
            tis_cap is None or old_logp_source == "replay",
            "algorithm.tis_cap weighs each token by π_old / π_rollout, which needs the replayed "
            "π_old: set algorithm.old_logp_source=replay (or tis_cap=null)",
        )
        self.policy: TokenPolicy = policy
        self.loss_agg = loss_agg
        self.norm_length = norm_length
        self.old_logp_source = old_logp_source
        self.tis_cap = tis_cap
        # the rollout-vs-replay gap of the current rollout: Σ|Δ log p|, tokens, max
        self._gap_sum: float = 0.0
        self._gap_tokens: int = 0
        self._gap_max: float = 0.0

    # -- per-token loss: the one thing subclasses define -------------------------------------

    @abstractmethod
    def token_terms(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss_terms[T], ratio[T])`` for packed tokens (fp32)."""

    def policy_terms(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        adv: torch.Tensor,
        offsets: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss_terms[T], ratio[T])`` with the rows' ``offsets`` and loss ``mask`` at hand;
        a per-token loss only needs :meth:`token_terms` (a sequence-level one, GSPO, overrides
        this)."""
        return self.token_terms(log_prob, old_log_prob, adv)

    # -- anchoring ---------------------------------------------------------------------------

    def _log_probs(self, conditions: Conditions, segment: TextSegment) -> Packed:
        out = self.policy.token_log_probs(conditions, segment)
        if not torch.equal(out.offsets.cpu(), segment.tokens.offsets.cpu()):
            raise ValueError(
                f"{type(self.policy).__name__}.token_log_probs returned offsets "
                f"{out.offsets.tolist()} but the segment's tokens have {segment.tokens.offsets.tolist()}"
            )
        return out

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: TextSegment) -> TextSegment:
        """Anchor π_old (``log_probs``); measure the rollout-vs-replay gap when the engine
        recorded log-probs; keep them as ``rollout_log_probs`` when ``tis_cap`` needs them."""
        recorded = segment.log_probs
        if self.old_logp_source == "current":  # π_old comes from the loss forward itself
            return dataclasses.replace(segment, rollout_log_probs=recorded)
        if self.old_logp_source == "rollout" and recorded is None:
            raise ValueError("old_logp_source=rollout but the rollout recorded no log_probs")
        if self.tis_cap is not None and recorded is None:
            raise ValueError(
                "algorithm.tis_cap needs the rollout's log_probs, but the rollout recorded none"
            )
        replay = self._log_probs(conditions, segment).values.detach().float()
        if recorded is not None:
            self._observe_gap(recorded.values, replay, segment)
        anchor = replay if self.old_logp_source == "replay" else recorded.values.float()  # type: ignore[union-attr]
        offsets = segment.tokens.offsets
        return dataclasses.replace(
            segment,
            log_probs=Packed(values=anchor, offsets=offsets),
            rollout_log_probs=(
                Packed(values=recorded.values.float(), offsets=offsets)  # type: ignore[union-attr]
                if self.tis_cap is not None
                else None
            ),
        )

    def _observe_gap(
        self, recorded: torch.Tensor, replay: torch.Tensor, segment: TextSegment
    ) -> None:
        mask = self._mask(segment, replay)
        gap = (recorded.float().to(replay.device) - replay).abs()[mask]
        if gap.numel():
            total, worst = torch.stack([gap.double().sum(), gap.double().max()]).tolist()
            self._gap_sum += float(total)
            self._gap_tokens += int(gap.numel())
            self._gap_max = max(self._gap_max, float(worst))

    @staticmethod
    def _mask(segment: TextSegment, like: torch.Tensor) -> torch.Tensor:
        if segment.loss_mask is not None:
            return segment.loss_mask.values.to(like.device).bool()
        return torch.ones_like(like, dtype=torch.bool)

    def start_rollout(self, rollout_index: int) -> None:
        self._gap_sum, self._gap_tokens, self._gap_max = 0.0, 0, 0.0

    @distributed(dispatch=Dispatch.BROADCAST)
    def after_train(self, rollout_index: int) -> dict[str, float]:
        """The KL controller's step, and this rank's rollout-vs-replay gap of the rollout
        (``rollout/logp_gap``: mean |Δ log p| per loss token; ``rollout/logp_gap_max``)."""
        out = self.kl_after_train()
        if self._gap_tokens:
            out["rollout/logp_gap"] = self._gap_sum / self._gap_tokens
            out["rollout/logp_gap_max"] = self._gap_max
        return out

    def micro_batch_weight(self, segment: TextSegment, advantages: torch.Tensor) -> float:
        """The micro-batch's share in the mini-batch's aggregation: its loss tokens for
        ``token-mean``, its sequences with a loss token for ``seq-mean-token-mean``, its
        sequences for ``seq-mean-token-sum-norm``; so the stack's loss equals the mini-batch's
        whatever the micro-batches."""
        offsets = segment.tokens.offsets
        mask = self._mask(segment, segment.tokens.values)
        if self.loss_agg == "token-mean":
            return float(mask.sum())
        if self.loss_agg == "seq-mean-token-mean":
            counts = pad_packed(mask, offsets.to(mask.device), False).sum(dim=1)
            return float((counts > 0).sum())
        return float(len(offsets) - 1)

    # -- loss --------------------------------------------------------------------------------

    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: TextSegment,
        advantages: torch.Tensor,
        loss_scale: float,
    ) -> StepResult:
        if segment.log_probs is None and self.old_logp_source != "current":
            raise ValueError(
                f"{type(self).__name__} needs anchored log_probs; call prepare_segment first"
            )
        offsets = segment.tokens.offsets
        lengths = (offsets[1:] - offsets[:-1]).to(advantages.device)
        require(
            advantages.ndim == 1 and advantages.numel() == len(lengths),
            f"advantages must be per sample [B={len(lengths)}], got {tuple(advantages.shape)}",
        )
        current = self._log_probs(conditions, segment).values.float()
        device = current.device
        if self.old_logp_source == "current":
            old = current.detach()
            if segment.rollout_log_probs is not None:
                self._observe_gap(segment.rollout_log_probs.values, old, segment)
        else:
            old = segment.log_probs.values.float().to(device)  # type: ignore[union-attr]
        if segment.loss_mask is not None:
            mask = segment.loss_mask.values.to(device).bool()
        else:
            mask = torch.ones_like(current, dtype=torch.bool)
        if segment.token_advantages is not None:  # computed by the loss (REINFORCE++)
            adv = segment.token_advantages.values.float().to(device)
        else:
            adv = torch.repeat_interleave(advantages.float(), lengths).to(device)
        # masked tokens see log-ratio 0 (ratio 1, k3 0): no inf from an unused position can
        # reach the backward pass as inf·0
        zero = torch.zeros_like(current)
        lp = torch.where(mask, current, zero)
        old_lp = torch.where(mask, old, zero)
        policy_terms, ratio = self.policy_terms(lp, old_lp, adv, offsets.to(device), mask)
        tis_weight = None
        if self.tis_cap is not None:
            if segment.rollout_log_probs is None:
                raise ValueError(
                    "algorithm.tis_cap: the segment lost its rollout_log_probs; anchor it with "
                    "prepare_segment"
                )
            rollout = segment.rollout_log_probs.values.float().to(device)
            log_w = torch.where(mask, old_lp - rollout, zero)
            tis_weight = torch.exp(log_w).clamp(max=self.tis_cap).detach()
            policy_terms = policy_terms * tis_weight
        terms, kl = policy_terms, None
        control = self.kl_controller
        if control.enabled and not self.kl_in_reward:
            with torch.no_grad(), self.reference():
                ref = self._log_probs(conditions, segment).values.float().to(device)
            kl = k3_kl(lp, torch.where(mask, ref, zero))
            terms = terms + control.beta * kl
        loss = aggregate(
            pad_packed(terms, offsets),
            pad_packed(mask, offsets, False),
            self.loss_agg,
            norm_length=self.norm_length,
        )
        (loss * loss_scale).backward()
        out = {
            "ratio": ratio.detach()[mask],
            "log_ratio": (lp - old_lp).detach()[mask],
            "policy_loss": policy_terms.detach()[mask],
            "num_tokens": mask.sum().reshape(1).float(),
        }
        if kl is not None:
            out["kl"] = kl.detach()[mask]
            control.observe(out["kl"])
        if tis_weight is not None:
            out["tis_weight"] = tis_weight[mask]
        return StepResult(loss=loss.detach() * loss_scale, terms=out)

    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        ratio, log_ratio = terms["ratio"].float(), terms["log_ratio"].float()
        empty = ratio.numel() == 0
        out = {
            "ratio/mean": 1.0 if empty else float(ratio.mean()),
            "ratio/std": float(ratio.std(unbiased=False)) if ratio.numel() > 1 else 0.0,
            "ratio/min": 1.0 if empty else float(ratio.min()),
            "ratio/max": 1.0 if empty else float(ratio.max()),
            "approx_kl": 0.0 if empty else float(0.5 * log_ratio.square().mean()),
            "policy_loss": 0.0 if empty else float(terms["policy_loss"].float().mean()),
            "tokens": float(terms["num_tokens"].sum()),
        }
        if "kl" in terms and not empty:
            out["kl_loss"] = float(terms["kl"].float().mean())
            out["kl/max"] = float(terms["kl"].float().max())
            out["kl/beta"] = float(self.kl_controller.beta)
        if "tis_weight" in terms and not empty:
            weight = terms["tis_weight"].float()
            out["tis/weight_mean"] = float(weight.mean())
            out["tis/capped_frac"] = float((weight >= float(self.tis_cap or 0.0)).float().mean())
        return out


def clip_fractions(terms: dict[str, torch.Tensor], low: float, high: float) -> dict[str, float]:
    """Share of loss tokens whose ratio is above ``1 + high`` / below ``1 − low``."""
    ratio = terms["ratio"].float()
    if not ratio.numel():
        return {"clipfrac/above": 0.0, "clipfrac/below": 0.0}
    return {
        "clipfrac/above": float((ratio > 1 + high).float().mean()),
        "clipfrac/below": float((ratio < 1 - low).float().mean()),
    }


class GRPO(TokenPolicyLoss):
    """Token-level GRPO with DAPO's decoupled clip: ``clip_low`` = ε_low, ``clip_high`` = ε_high
    (set ``clip_high`` > ``clip_low``, e.g. 0.28 vs 0.2, for clip-higher)."""

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        loss_agg: str = "token-mean",
        norm_length: int | None = None,
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: str = "replay",
        tis_cap: float | None = None,
    ) -> None:
        require(0 < clip_low < 1, f"algorithm.clip_low must be in (0, 1), got {clip_low}")
        require(clip_high > 0, f"algorithm.clip_high must be > 0, got {clip_high}")
        super().__init__(
            policy=policy,
            loss_agg=loss_agg,
            norm_length=norm_length,
            kl=kl,
            old_logp_source=old_logp_source,
            tis_cap=tis_cap,
        )
        self.clip_low = clip_low
        self.clip_high = clip_high

    def token_terms(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return grpo_clip_loss(log_prob, old_log_prob, adv, self.clip_low, self.clip_high)

    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        return {**super().summarize(terms), **clip_fractions(terms, self.clip_low, self.clip_high)}


class GSPO(GRPO):
    """Group Sequence Policy Optimization (Zheng et al., 2025, "Group Sequence Policy
    Optimization"): one importance ratio per sequence, the length-normalised
    ``s_i = exp(mean_t(log π(y_t) − log π_old(y_t)))`` over the sequence's loss tokens, clipped
    to ``[1 − clip_low, 1 + clip_high]`` (the paper's 3e-4 / 4e-4: a sequence ratio moves far
    less than a token's). Token form: every loss token of sequence i carries
    ``s_i,t = sg[s_i]·π(y_t)/sg[π(y_t)]`` (value ``s_i``, gradient ``s_i ∇log π(y_t)``), so with
    ``loss_agg=seq-mean-token-mean`` the loss is the paper's ``−mean_i min(s_i A_i, clip(s_i)
    A_i)`` and its gradient ``−A_i s_i mean_t ∇log π(y_t)`` for an unclipped sequence."""

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        clip_low: float = 3e-4,
        clip_high: float = 4e-4,
        loss_agg: str = "seq-mean-token-mean",
        norm_length: int | None = None,
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: str = "replay",
        tis_cap: float | None = None,
    ) -> None:
        """GRPO's knobs (named, so a misspelt key is refused before Ray) with the paper's
        sequence-ratio clip and per-sequence averaging as defaults."""
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

    def policy_terms(
        self,
        log_prob: torch.Tensor,
        old_log_prob: torch.Tensor,
        adv: torch.Tensor,
        offsets: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = offsets[1:] - offsets[:-1]
        rows = torch.repeat_interleave(torch.arange(len(lengths), device=offsets.device), lengths)
        tokens = torch.zeros(len(lengths), device=log_prob.device).index_add(0, rows, mask.float())
        diff = torch.where(mask, log_prob - old_log_prob, torch.zeros_like(log_prob))
        seq_log_ratio = torch.zeros(len(lengths), device=log_prob.device).index_add(0, rows, diff)
        seq_log_ratio = seq_log_ratio / tokens.clamp_min(1.0)
        seq_ratio = torch.exp(seq_log_ratio.detach())[rows]  # s_i on each of its tokens
        ratio = seq_ratio * torch.exp(log_prob - log_prob.detach())
        return clipped_surrogate(ratio, adv, self.clip_low, self.clip_high), ratio
