"""DDPO and DPOK: policy gradients on the denoising MDP (docs/math.md, "DDPO" and "DPOK").

Each SDE step x_t -> x_{t-1} is an action with a Gaussian policy p_θ(x_{t-1} | x_t, c); the
episode's reward arrives at x₀. Per trained step (i, t), with A_i the sample's advantage:

    DDPO_IS  ℓ = max(−A·r, −A·clip(r, 1 − ε, 1 + ε)),   r = p_θ(x_{t-1}|x_t) / p_old(x_{t-1}|x_t)
    DDPO_SF  ℓ = −A · log p_θ(x_{t-1} | x_t)           (on-policy: one optimizer step per rollout)
    DPOK     ℓ = α · ℓ_policy + β · KL(p_θ(·|x_t) ‖ p_pre(·|x_t))
             KL = mean ‖μ_θ − μ_pre‖² / (2σ_t²)         (equal-variance Gaussians, closed form)

Black et al., "Training Diffusion Models with Reinforcement Learning" (arXiv:2305.13301);
Fan et al., "DPOK: Reinforcement Learning for Fine-tuning Text-to-Image Diffusion Models"
(arXiv:2305.16381). The per-prompt reward normalisation of DDPO is the trainer's advantage
step (``advantage: {scope: group, std: group}``: each prompt's samples of a rollout are one
group). The replay loop is ``replay.replay_slot_losses``; this module brings the per-step term.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.kl import KLConfig, kl_metrics
from unirl.algorithms.losses import clipped_surrogate
from unirl.algorithms.replay import (
    ReplayPipeline,
    check_flow_knobs,
    check_record_uncond,
    check_slots_per_forward,
    ratio_metrics,
    replay_anchors,
    replay_slot_losses,
    replayed_log_prob,
    reuses_uncond,
    uncond_metrics,
)
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.models.common.denoise import StepRecord
from unirl.models.common.guidance import CFGGradient
from unirl.types import Conditions, LatentSegment

Estimator = Literal["importance", "score_function"]
ESTIMATORS: tuple[str, ...] = ("importance", "score_function")


def ddpo_policy_loss(
    log_prob: Tensor, old_log_prob: Tensor | None, adv: Tensor, clip_range: float, estimator: str
) -> tuple[Tensor, Tensor]:
    """Per-term DDPO policy loss and ratio (``log_prob[B]``, ``adv[B]``).

    ``importance`` (DDPO_IS): PPO's clipped surrogate of r = exp(log p − log p_old).
    ``score_function`` (DDPO_SF): −A·log p; ``old_log_prob`` is not read and the ratio returned
    is exp(log p − sg(log p)) = 1 (its gradient is that of ``importance`` at r = 1)."""
    if estimator == "importance":
        if old_log_prob is None:
            raise ValueError("estimator=importance needs old log-probs (anchor the segment first)")
        ratio = torch.exp(log_prob - old_log_prob)
        return clipped_surrogate(ratio, adv, clip_range, clip_range), ratio
    if estimator == "score_function":
        return -adv * log_prob, torch.exp(log_prob - log_prob.detach())
    raise ValueError(f"unknown estimator {estimator!r}; use one of {ESTIMATORS}")


class DDPO(StageAlgorithm[LatentSegment]):
    """DDPO (Black et al. 2023) for flow-matching models: a policy gradient over the SDE steps.

    ``estimator``: ``importance`` (DDPO_IS, the default: PPO's clipped surrogate of the per-step
    ratio of the SDE transition log-probs, with ``clip_range`` ε; several optimizer steps per
    rollout allowed) or ``score_function`` (DDPO_SF: −A·log p_θ(x_{t-1} | x_t), REINFORCE; exact
    only on-policy, so the train stack refuses ``stack.num_updates_per_batch > 1`` for it).
    ``old_logp_source`` (importance only): ``replay`` (π_old replayed at the training geometry
    before the first update: the first ratio is exactly 1) or ``rollout`` (the sampler's
    log-probs). ``cfg_gradient`` and ``slots_per_forward`` as in :class:`FlowGRPO`.
    Per-prompt reward normalisation (the paper's per-prompt stat tracking) is the recipe's
    ``advantage: {scope: group, std: group}``.
    """

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        estimator: Estimator = "importance",
        clip_range: PositiveFloat = 1e-4,
        old_logp_source: Literal["replay", "rollout"] = "replay",
        cfg_gradient: CFGGradient = "cond_only",
        slots_per_forward: PositiveInt = 1,
        kl: KLConfig | Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(kl=kl)
        require(
            estimator in ESTIMATORS,
            f"algorithm.estimator must be 'importance' (DDPO_IS, clipped ratio) or "
            f"'score_function' (DDPO_SF, REINFORCE), got {estimator!r}",
        )
        require(clip_range > 0, "algorithm.clip_range must be > 0")
        check_flow_knobs("gaussian", old_logp_source, cfg_gradient)
        check_record_uncond(pipeline, cfg_gradient)
        check_slots_per_forward(slots_per_forward)
        self.pipeline = pipeline
        self.estimator: Estimator = estimator
        self.clip_range = clip_range
        self.kl_form: Literal["gaussian"] = "gaussian"
        # the score-function estimator reads no π_old: its log p is the loss forward's own, which
        # is the sampling policy's only before the first optimizer step ("current", which the
        # train stack refuses with several updates per rollout)
        self.old_logp_source = "current" if estimator == "score_function" else old_logp_source
        self.cfg_gradient: CFGGradient = cfg_gradient
        self.slots_per_forward = slots_per_forward
        self.policy_weight = 1.0

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: LatentSegment) -> LatentSegment:
        if self.estimator == "score_function":
            return segment
        if self.old_logp_source == "rollout":
            if segment.sde_logp is None:
                raise ValueError("old_logp_source=rollout but the rollout recorded no sde_logp")
            return segment
        return replay_anchors(
            self.pipeline,
            conditions,
            segment,
            means=False,
            cfg_gradient=self.cfg_gradient,
            reuse_uncond=bool(reuses_uncond(self, segment)),
            slots_per_forward=self.slots_per_forward,
        )

    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        advantages: torch.Tensor,
        loss_scale: float,
    ) -> StepResult:
        importance = self.estimator == "importance"
        if importance and segment.sde_logp is None:
            raise ValueError(
                "DDPO estimator=importance needs anchored sde_logp; call prepare_segment"
            )
        adv = advantages.float().to(segment.sigmas.device)

        def policy_terms(k: int, record: StepRecord) -> tuple[Tensor, dict[str, Tensor]]:
            log_prob = replayed_log_prob(record, self.pipeline.strategy)
            adv_k = adv.to(log_prob.device)
            old = segment.sde_logp[:, k].to(log_prob.device) if importance else None  # type: ignore[index]
            policy, ratio = ddpo_policy_loss(log_prob, old, adv_k, self.clip_range, self.estimator)
            log_ratio = (log_prob - old) if old is not None else torch.zeros_like(log_prob)
            terms = {
                "ratio": ratio.detach(),
                "log_ratio": log_ratio.detach(),
                "log_prob": log_prob.detach(),
                "policy_loss": policy.detach(),
            }
            return self.policy_weight * policy.mean(), terms

        return replay_slot_losses(self, conditions, segment, loss_scale, policy_terms)

    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """Ratio stats and clip fractions (importance), ``policy_loss``, ``log_prob/mean``;
        with ``kl.beta > 0`` the KL metrics (``kl_loss``, ``kl/max``, ``kl/step_<k>``, ``kl/beta``)."""
        out = ratio_metrics(terms["ratio"], terms["log_ratio"])
        if self.estimator == "importance":
            ratio, eps = terms["ratio"].float(), self.clip_range
            out["clipfrac/above"] = float((ratio > 1 + eps).float().mean())
            out["clipfrac/below"] = float((ratio < 1 - eps).float().mean())
        out["policy_loss"] = float(terms["policy_loss"].float().mean())
        out["log_prob/mean"] = float(terms["log_prob"].float().mean())
        out.update(kl_metrics(terms, self.kl_controller.beta))
        out.update(uncond_metrics(terms))
        return out


class DPOK(DDPO):
    """DPOK (Fan et al. 2023): a KL-regularised policy gradient on the denoising MDP.

    Per trained step: ``policy_weight`` (the paper's α) times the DDPO policy term of
    ``estimator`` (``score_function``, the paper's gradient, by default; ``importance`` for its
    clipped-ratio practical form), plus ``kl.beta`` (β > 0, required) times the closed-form KL
    between the current and the frozen pretrained step Gaussians (equal variances):
    mean ‖μ_θ − μ_pre‖² / (2σ_t²), σ_t the strategy's step std. The pretrained policy is the
    base with the LoRA adapter disabled (a recipe without LoRA has no reference and is refused).
    ``kl.control=adaptive`` steers β toward ``kl.target`` as in every loss.
    """

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        kl: KLConfig | Mapping[str, object] | None = None,
        policy_weight: PositiveFloat = 1.0,
        estimator: Estimator = "score_function",
        clip_range: PositiveFloat = 1e-4,
        old_logp_source: Literal["replay", "rollout"] = "replay",
        cfg_gradient: CFGGradient = "cond_only",
        slots_per_forward: PositiveInt = 1,
    ) -> None:
        super().__init__(
            pipeline=pipeline,
            estimator=estimator,
            clip_range=clip_range,
            old_logp_source=old_logp_source,
            cfg_gradient=cfg_gradient,
            slots_per_forward=slots_per_forward,
            kl=kl,
        )
        require(
            self.kl_controller.enabled,
            "DPOK regularises toward the pretrained model: set algorithm.kl.beta > 0 "
            "(e.g. +algorithm.kl.beta=0.01), or use unirl.algorithms.DDPO for no KL",
        )
        require(policy_weight > 0, "algorithm.policy_weight (DPOK's alpha) must be > 0")
        self.policy_weight = float(policy_weight)
