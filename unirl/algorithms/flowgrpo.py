"""Flow-GRPO: clipped likelihood ratio over SDE steps, optional KL to the frozen base.

    r = exp(log p_θ(x'|x) − log p_old(x'|x)),  L = mean max(−A·r, −A·clip(r, 1 ± ε)) + β·KL

Log-probs are means over C·H·W (see ``unirl/sde``), so ε is small (1e-4 … 1e-5).
Variants (DanceGRPO, MixGRPO, Flow-GRPO-Fast) are recipes: a strategy and an SDE-step schedule.
``ratio_norm="grpo_guard"`` switches on GRPO-Guard (RatioNorm + 1/(−Δ) step reweighting).

π_old is anchored and every trained slot replayed by the machinery this loss shares with
Flow-DPPO (``replay.py``); this module holds only the Flow-GRPO loss node. β of the KL is
configured by ``kl`` (a :class:`~unirl.algorithms.kl.KLConfig`: fixed or adaptive).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.kl import KLConfig, kl_metrics
from unirl.algorithms.losses import clipped_surrogate, grpo_guard_log_ratio
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
    slot_sigmas,
    uncond_metrics,
)
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.models.common.denoise import StepRecord
from unirl.models.common.guidance import CFGGradient
from unirl.types import Conditions, LatentSegment

OLD_LOGP_SOURCES = ("replay", "rollout", "current")


class FlowGRPO(StageAlgorithm[LatentSegment]):
    """The GRPO loss for flow-matching models.

    ``old_logp_source``: ``replay`` recomputes π_old with the current weights at exactly the
    training micro-batch geometry before any update (the first ratio is then exactly 1);
    ``rollout`` trusts the log-probs recorded while sampling (exact only when the rollout ran
    at the same batch geometry and precision); ``current`` takes π_old (and GRPO-Guard's
    anchor means) from the loss forward itself, detached: the same value ``replay`` computes
    in a pass of its own, so the ratio is exactly 1 without that pass. It holds only while
    no optimizer step has happened since the rollout, so the stack refuses it with
    ``stack.num_updates_per_batch`` above 1. ``kl_form``: ``gaussian`` (exact KL of two
    equal-variance Gaussians) or ``reference`` (divides by the noise scale only, as the
    Flow-GRPO code does).

    ``kl`` (:class:`~unirl.algorithms.kl.KLConfig`): ``kl.beta`` is the fixed β
    (``kl.control="fixed"``) or the initial one (``"adaptive"``: steered toward ``kl.target``
    with horizon ``kl.horizon`` rollouts, see :mod:`unirl.algorithms.kl`). Metrics with
    ``kl.beta > 0``: ``kl_loss``, ``kl/max``, ``kl/step_<k>`` (mean KL of trained slot k),
    ``kl/beta``.

    ``ratio_norm``: ``none`` (plain Flow-GRPO) or ``grpo_guard``: the ratio is
    ``exp((log r + D)·σ_t)`` with D = mean ‖μ_θ − μ_old‖²/(2σ_t²) and σ_t the step std, and
    each step's clipped term is divided by −Δ = σ − σ' (GRPO-Guard's gradient reweighting).
    It anchors the Gaussian means too (``sde_means``) and needs a normalised Gaussian log-prob
    (FlowSDE, DanceSDE, or CPS with ``log_prob_form="gaussian"``). Its ratios are much closer
    to 1 than plain ones, so tune ``clip_range`` down (GRPO-Guard setups use a few 1e-6).

    ``cfg_gradient`` (with guidance on): ``cond_only`` (the default, flow_grpo's training
    forward: the unconditional prediction runs as its own no-grad forward, ∇v = g·∇v_c) or
    ``both`` (one batched forward, gradient through both halves, ∇v = (1 − g)·∇v_u + g·∇v_c).
    The π_old anchor replays with the same forwards, so the first ratio is exactly 1 either
    way; ``old_logp_source="rollout"`` with ``cond_only`` compares the sampler's batched
    ``[uncond; cond]`` forward with two N-row forwards, exact only where the model's rows do
    not depend on the batch they share (true of the tiny CPU models the tests use).

    ``slots_per_forward``: trained slots replayed together as the rows of one forward +
    backward (1: one slot at a time). The loss and its gradient are the same, up to the
    kernels' batch-size rounding; fewer, larger passes cost less host time per row and
    activation memory grows with the group (see ``docs/performance.md``). The π_old anchor
    uses the same groups, so the first ratio stays exactly 1.
    """

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        clip_range: PositiveFloat = 1e-4,
        kl: KLConfig | Mapping[str, object] | None = None,
        kl_form: Literal["gaussian", "reference"] = "gaussian",
        old_logp_source: Literal["replay", "rollout", "current"] = "replay",
        cfg_gradient: CFGGradient = "cond_only",
        slots_per_forward: PositiveInt = 1,
        ratio_norm: Literal["none", "grpo_guard"] = "none",
    ) -> None:
        super().__init__(kl=kl)
        require(clip_range > 0, "algorithm.clip_range must be > 0")
        check_flow_knobs(kl_form, old_logp_source, cfg_gradient, OLD_LOGP_SOURCES)
        check_record_uncond(pipeline, cfg_gradient)
        check_slots_per_forward(slots_per_forward)
        require(
            ratio_norm in ("none", "grpo_guard"),
            "algorithm.ratio_norm must be 'none' or 'grpo_guard'",
        )
        if ratio_norm == "grpo_guard":
            form = getattr(getattr(pipeline, "strategy", None), "log_prob_form", "gaussian")
            require(
                form == "gaussian",
                f"algorithm.ratio_norm=grpo_guard needs a normalised Gaussian log-prob, but the "
                f"strategy uses log_prob_form={form!r}; set pipeline.strategy.log_prob_form=gaussian "
                "or ratio_norm=none",
            )
        self.pipeline = pipeline
        self.clip_range = clip_range
        self.kl_form = kl_form
        self.old_logp_source = old_logp_source
        self.cfg_gradient: CFGGradient = cfg_gradient
        self.slots_per_forward = slots_per_forward
        self.ratio_norm = ratio_norm

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: LatentSegment) -> LatentSegment:
        guard = self.ratio_norm == "grpo_guard"
        if self.old_logp_source == "current":  # π_old comes from the loss forward itself
            return segment
        if self.old_logp_source == "rollout":
            if segment.sde_logp is None:
                raise ValueError("old_logp_source=rollout but the rollout recorded no sde_logp")
            if guard and segment.sde_means is None:
                raise ValueError(
                    "ratio_norm=grpo_guard with old_logp_source=rollout needs the rollout's "
                    "sde_means; set pipeline.record_means=true or old_logp_source=replay"
                )
            return segment
        return replay_anchors(
            self.pipeline,
            conditions,
            segment,
            means=guard,
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
        current = self.old_logp_source == "current"
        assert current or segment.sde_logp is not None
        guard = self.ratio_norm == "grpo_guard"

        def policy_terms(
            k: int, record: StepRecord
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            log_prob = replayed_log_prob(record, self.pipeline.strategy)
            adv = advantages.float().to(log_prob.device)
            old_mean: torch.Tensor | None
            if current:
                old_logp, old_mean = log_prob.detach(), record.mean.detach()
            else:
                assert segment.sde_logp is not None
                old_logp = segment.sde_logp[:, k]
                old_mean = None if segment.sde_means is None else segment.sde_means[:, k]
            log_ratio = log_prob - old_logp
            if guard:
                assert old_mean is not None
                sigma, sigma_next, sigma_max = slot_sigmas(segment, k, record.mean.device)
                std = self.pipeline.strategy.step_std(sigma, sigma_next, sigma_max=sigma_max)
                guard_log_ratio = grpo_guard_log_ratio(
                    log_prob, old_logp, record.mean, old_mean, std
                )
                ratio = torch.exp(guard_log_ratio)
                policy = clipped_surrogate(ratio, adv, self.clip_range, self.clip_range) / (
                    sigma - sigma_next
                )
            else:
                ratio = torch.exp(log_ratio)
                policy = clipped_surrogate(ratio, adv, self.clip_range, self.clip_range)
            terms = {
                "ratio": ratio.detach(),
                "log_ratio": log_ratio.detach(),
                "policy_loss": policy.detach(),
            }
            return policy.mean(), terms

        return replay_slot_losses(self, conditions, segment, loss_scale, policy_terms)

    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        ratio = terms["ratio"].float()
        eps = self.clip_range
        out = ratio_metrics(ratio, terms["log_ratio"])
        out["clipfrac/above"] = float((ratio > 1 + eps).float().mean())
        out["clipfrac/below"] = float((ratio < 1 - eps).float().mean())
        out["policy_loss"] = float(terms["policy_loss"].float().mean())
        out.update(kl_metrics(terms, self.kl_controller.beta))
        out.update(uncond_metrics(terms))
        return out
