"""Flow-DPPO: a KL mask in place of PPO's ratio clip (docs/math.md, "Flow-DPPO").

    D = mean (μ_θ − μ_old)² / (2σ_t²)         σ_t = the step std of the strategy in use
    drop (i, t) when D ≥ τ and ((r > 1 ∧ A > 0) ∨ (r < 1 ∧ A < 0))
    L = mean over kept terms of −A·r  (+ β·KL to the frozen base)

A term is dropped only when the policy has already moved far (in KL) from π_old *and* keeps
moving the way its advantage pushes it; moving back toward π_old is always allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.kl import KLConfig, kl_metrics
from unirl.algorithms.losses import flow_dppo_loss
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


class FlowDPPO(StageAlgorithm[LatentSegment]):
    """The KL-masked policy loss for flow-matching models.

    ``kl_threshold`` is τ (D is a mean over C·H·W, so τ is small: ~1e-5). π_old is the pair
    (``sde_logp``, ``sde_means``): ``old_logp_source="replay"`` recomputes both with the
    current weights at the training micro-batch geometry before any update, so the first
    step has ratio 1 and D = 0 exactly; ``"rollout"`` uses what sampling recorded (needs
    ``pipeline.record_means=true``). σ_t comes from ``pipeline.strategy.step_std`` for the
    sigmas of each sample's slot, so Flow, Dance and CPS kernels each get their own σ_t.
    ``kl`` / ``kl_form``: optional KL to the frozen base with a fixed or adaptive β, as in
    :class:`FlowGRPO`. ``cfg_gradient``: ``cond_only`` (default) or ``both``, and
    ``slots_per_forward`` (trained slots per forward + backward), as in :class:`FlowGRPO`.

    The loss of a micro-batch is the mean over its trained steps of each step's kept-term
    mean (each step's own mean also when ``slots_per_forward`` replays several steps in one
    forward + backward: the kept count of later steps is not known when an earlier group
    backpropagates).
    """

    def __init__(
        self,
        *,
        pipeline: ReplayPipeline,
        kl_threshold: PositiveFloat = 1e-5,
        kl: KLConfig | Mapping[str, object] | None = None,
        kl_form: Literal["gaussian", "reference"] = "gaussian",
        old_logp_source: Literal["replay", "rollout"] = "replay",
        cfg_gradient: CFGGradient = "cond_only",
        slots_per_forward: PositiveInt = 1,
    ) -> None:
        super().__init__(kl=kl)
        require(
            kl_threshold > 0,
            "algorithm.kl_threshold must be > 0 (D >= 0 always, so 0 would drop every term that moves)",
        )
        check_flow_knobs(kl_form, old_logp_source, cfg_gradient)
        check_record_uncond(pipeline, cfg_gradient)
        check_slots_per_forward(slots_per_forward)
        self.pipeline = pipeline
        self.kl_threshold = kl_threshold
        self.kl_form = kl_form
        self.old_logp_source = old_logp_source
        self.cfg_gradient: CFGGradient = cfg_gradient
        self.slots_per_forward = slots_per_forward

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: LatentSegment) -> LatentSegment:
        if self.old_logp_source == "rollout":
            if segment.sde_logp is None or segment.sde_means is None:
                raise ValueError(
                    "FlowDPPO with old_logp_source=rollout needs sde_logp and sde_means from the "
                    "rollout; set pipeline.record_means=true or old_logp_source=replay"
                )
            return segment
        return replay_anchors(
            self.pipeline,
            conditions,
            segment,
            means=True,
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
        if segment.sde_logp is None or segment.sde_means is None:
            raise ValueError(
                "FlowDPPO needs anchored sde_logp and sde_means; call prepare_segment first"
            )
        adv = advantages.float().to(segment.sde_logp.device)

        def policy_terms(
            k: int, record: StepRecord
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            assert segment.sde_logp is not None and segment.sde_means is not None
            log_prob = replayed_log_prob(record, self.pipeline.strategy)
            sigma, sigma_next, sigma_max = slot_sigmas(segment, k, record.mean.device)
            std = self.pipeline.strategy.step_std(sigma, sigma_next, sigma_max=sigma_max)
            out = flow_dppo_loss(
                log_prob,
                segment.sde_logp[:, k],
                adv,
                record.mean,
                segment.sde_means[:, k],
                std,
                self.kl_threshold,
            )
            terms = {
                "ratio": out.ratio,
                "log_ratio": (log_prob - segment.sde_logp[:, k]).detach(),
                "dppo_kl": out.kl,
                "keep": out.keep,
                "over": out.over,
                "directional": out.directional,
                "adv": adv.expand_as(out.ratio),
                "policy_loss": out.loss.detach().reshape(1),
            }
            return out.loss, terms

        return replay_slot_losses(self, conditions, segment, loss_scale, policy_terms)

    def summarize(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """Ratio stats, D mean/max, and the mask: ``mask/dropped`` (all dropped terms), split into
        ``mask/dropped_pos`` (A > 0, r > 1) and ``mask/dropped_neg`` (A < 0, r < 1);
        ``mask/over_threshold`` (D ≥ τ) and ``mask/spared_by_direction`` (D ≥ τ but kept because
        the ratio moves against the advantage); with ``kl.beta > 0`` the KL metrics of
        :func:`~unirl.algorithms.kl.kl_metrics` (``kl_loss``, ``kl/max``, ``kl/step_<k>``,
        ``kl/beta``)."""
        out = ratio_metrics(terms["ratio"], terms["log_ratio"])
        keep, over, adv = terms["keep"].bool(), terms["over"].bool(), terms["adv"]
        dropped = ~keep
        d = terms["dppo_kl"].float()
        out.update(
            {
                "mask/dropped": float(dropped.float().mean()),
                "mask/dropped_pos": float((dropped & (adv > 0)).float().mean()),
                "mask/dropped_neg": float((dropped & (adv < 0)).float().mean()),
                "mask/over_threshold": float(over.float().mean()),
                "mask/spared_by_direction": float((over & keep).float().mean()),
                "dppo_kl/mean": float(d.mean()),
                "dppo_kl/max": float(d.max()),
                "policy_loss": float(terms["policy_loss"].float().mean()),
            }
        )
        out.update(kl_metrics(terms, self.kl_controller.beta))
        out.update(uncond_metrics(terms))
        return out
