"""Flow-GRPO: clipped likelihood ratio over SDE steps, optional KL to the frozen base.

    r = exp(log p_θ(x'|x) − log p_old(x'|x)),  L = mean max(−A·r, −A·clip(r, 1 ± ε)) + β·KL

Log-probs are means over C·H·W (see ``unirl/sde``), so ε is small (1e-4 … 1e-5).
Variants (DanceGRPO, MixGRPO, Flow-GRPO-Fast) are recipes: a strategy and an SDE-step schedule.
``ratio_norm="grpo_guard"`` switches on GRPO-Guard (RatioNorm + 1/(−Δ) step reweighting).

The module also holds the diffusion machinery shared with Flow-DPPO: anchoring π_old by
replay (:func:`replay_anchors`), the σ of a trained slot (:func:`slot_sigmas`), the
per-step KL to the frozen reference (:func:`reference_step`, :func:`step_kl`) and the
per-slot training loop itself (:func:`replay_slot_losses`). β of that KL is configured by
``kl`` (a :class:`~unirl.algorithms.kl.KLConfig`: fixed or adaptive).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.kl import KLConfig, kl_metrics
from unirl.algorithms.losses import clipped_surrogate, grpo_guard_log_ratio
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat
from unirl.models.common.denoise import StepRecord, sigma_max_of
from unirl.sde import SDEStrategy
from unirl.sde.kernels import KLForm
from unirl.types import Conditions, LatentSegment, host_to_device

# --------------------------------------------------------------------------- shared machinery


def check_flow_knobs(kl_form: str, old_logp_source: str) -> None:
    """Validate the knobs every replay-based diffusion loss shares."""
    require(
        kl_form in ("gaussian", "reference"), "algorithm.kl_form must be 'gaussian' or 'reference'"
    )
    require(
        old_logp_source in ("replay", "rollout"),
        "algorithm.old_logp_source must be 'replay' or 'rollout'",
    )


@torch.no_grad()
def replay_anchors(
    pipeline: Any, conditions: Conditions, segment: LatentSegment, *, means: bool
) -> LatentSegment:
    """π_old of every trained slot, replayed with the current weights at this micro-batch's
    geometry: ``sde_logp[B, S]`` and, when ``means``, ``sde_means[B, S, C, h, w]`` (fp32)."""
    logps, mus = [], []
    for k in range(segment.num_sde_steps):
        record = pipeline.replay(conditions, segment, k)
        logps.append(record.log_prob)
        if means:
            mus.append(record.mean.float())
    out = dataclasses.replace(segment, sde_logp=torch.stack(logps, dim=1).detach())
    if means:
        out = dataclasses.replace(out, sde_means=torch.stack(mus, dim=1).detach())
    return out


def slot_sigmas(
    segment: LatentSegment, slot: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    """``(σ[B], σ'[B], sigma_max)`` of trained slot ``slot`` of every sample (fp32, on ``device``)."""
    sigmas = segment.sigmas.float()
    idx = segment.sde_indices[:, slot]
    return (
        host_to_device(sigmas[idx], device),
        host_to_device(sigmas[idx + 1], device),
        sigma_max_of(sigmas),
    )


def reference_step(
    algorithm: StageAlgorithm,
    pipeline: Any,
    conditions: Conditions,
    segment: LatentSegment,
    slot: int,
) -> StepRecord:
    """Replay slot ``slot`` under the frozen reference (the backend's adapter-disable), no grad."""
    with torch.no_grad(), algorithm.reference():
        record: StepRecord = pipeline.replay(conditions, segment, slot)
    return record


def replayed_log_prob(record: StepRecord, strategy: object) -> torch.Tensor:
    """``log_prob[B]`` of a replayed step; a ratio loss cannot run on a strategy without one
    (the validators refuse that recipe, so this only guards direct use)."""
    if record.log_prob is None:
        raise ValueError(
            f"the replayed step has no log-prob: pipeline.strategy {type(strategy).__name__} "
            "records none; ratio losses need FlowSDE, CPS or DanceSDE"
        )
    return record.log_prob


def step_kl(
    strategy: SDEStrategy,
    mean: torch.Tensor,
    ref_mean: torch.Tensor,
    segment: LatentSegment,
    slot: int,
    form: KLForm,
) -> torch.Tensor:
    """``KL[B]`` between the policy's and the reference's step at slot ``slot`` (form: see
    ``SDEStrategy.kl``): ``gaussian`` divides by 2·std², ``reference`` by 2·noise_scale²."""
    sigma, sigma_next, sigma_max = slot_sigmas(segment, slot, mean.device)
    return strategy.kl(mean, ref_mean, sigma, sigma_next, form, sigma_max=sigma_max)


def replay_slot_losses(
    algorithm: Any,
    conditions: Conditions,
    segment: LatentSegment,
    loss_scale: float,
    policy_terms: Callable[[int, StepRecord], tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> StepResult:
    """The per-slot training loop the replay losses share (Flow-GRPO, Flow-DPPO).

    For each trained slot ``k``: the reference replay when the KL is on, the policy replay,
    ``policy_terms(k, record) -> (policy loss, per-slot terms)``, plus ``β·KL`` of the step,
    then backward scaled by ``loss_scale / S`` (one graph alive at a time). Terms are
    concatenated over slots; with the KL on, ``kl`` and ``kl_steps[B, S]`` are added. The
    loss comes back as a detached device scalar (no host sync per slot).
    """
    num_steps = segment.num_sde_steps
    kl = algorithm.kl_controller
    total: torch.Tensor | float = 0.0
    parts: dict[str, list[torch.Tensor]] = {}
    kls: list[torch.Tensor] = []
    for k in range(num_steps):
        ref = (
            reference_step(algorithm, algorithm.pipeline, conditions, segment, k)
            if kl.enabled
            else None
        )
        record = algorithm.pipeline.replay(conditions, segment, k)
        loss, terms = policy_terms(k, record)
        if ref is not None:
            step = step_kl(
                algorithm.pipeline.strategy, record.mean, ref.mean, segment, k, algorithm.kl_form
            )
            loss = loss + kl.beta * step.mean()
            kls.append(step.detach())
            kl.observe(step)
        (loss * (loss_scale / num_steps)).backward()
        total = total + loss.detach() / num_steps
        for name, value in terms.items():
            parts.setdefault(name, []).append(value)
    out = {name: torch.cat(values) for name, values in parts.items()}
    if kls:
        out["kl"] = torch.cat(kls)
        out["kl_steps"] = torch.stack(kls, dim=1)  # [B, S]: per trained slot
    return StepResult(loss=total * loss_scale, terms=out)


def ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor) -> dict[str, float]:
    """Ratio mean/std/min/max and approx_kl = ½·mean(Δlogp²) of the concatenated terms."""
    ratio = ratio.float()
    return {
        "ratio/mean": float(ratio.mean()),
        "ratio/std": float(ratio.std(unbiased=False)) if ratio.numel() > 1 else 0.0,
        "ratio/min": float(ratio.min()),
        "ratio/max": float(ratio.max()),
        "approx_kl": float(0.5 * log_ratio.float().square().mean()),
    }


# --------------------------------------------------------------------------- the loss


class FlowGRPO(StageAlgorithm):
    """The GRPO loss for flow-matching models.

    ``old_logp_source``: ``replay`` recomputes π_old with the current weights at exactly the
    training micro-batch geometry before any update (the first ratio is then exactly 1);
    ``rollout`` trusts the log-probs recorded while sampling (exact only when the rollout ran
    at the same batch geometry and precision). ``kl_form``: ``gaussian`` (exact KL of two
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
    """

    def __init__(
        self,
        *,
        pipeline: Any,
        clip_range: PositiveFloat = 1e-4,
        kl: KLConfig | Mapping[str, Any] | None = None,
        kl_form: Literal["gaussian", "reference"] = "gaussian",
        old_logp_source: Literal["replay", "rollout"] = "replay",
        ratio_norm: Literal["none", "grpo_guard"] = "none",
    ) -> None:
        super().__init__(kl=kl)
        require(clip_range > 0, "algorithm.clip_range must be > 0")
        check_flow_knobs(kl_form, old_logp_source)
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
        self.ratio_norm = ratio_norm

    @torch.no_grad()
    def prepare_segment(self, conditions: Conditions, segment: LatentSegment) -> LatentSegment:
        guard = self.ratio_norm == "grpo_guard"
        if self.old_logp_source == "rollout":
            if segment.sde_logp is None:
                raise ValueError("old_logp_source=rollout but the rollout recorded no sde_logp")
            if guard and segment.sde_means is None:
                raise ValueError(
                    "ratio_norm=grpo_guard with old_logp_source=rollout needs the rollout's "
                    "sde_means; set pipeline.record_means=true or old_logp_source=replay"
                )
            return segment
        return replay_anchors(self.pipeline, conditions, segment, means=guard)

    def compute_loss_and_backward(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        advantages: torch.Tensor,
        loss_scale: float,
    ) -> StepResult:
        assert segment.sde_logp is not None
        adv = advantages.float().to(segment.sde_logp.device)
        guard = self.ratio_norm == "grpo_guard"

        def policy_terms(
            k: int, record: StepRecord
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            assert segment.sde_logp is not None
            log_prob = replayed_log_prob(record, self.pipeline.strategy)
            log_ratio = log_prob - segment.sde_logp[:, k]
            if guard:
                assert segment.sde_means is not None
                sigma, sigma_next, sigma_max = slot_sigmas(segment, k, record.mean.device)
                std = self.pipeline.strategy.step_std(sigma, sigma_next, sigma_max=sigma_max)
                guard_log_ratio = grpo_guard_log_ratio(
                    log_prob,
                    segment.sde_logp[:, k],
                    record.mean,
                    segment.sde_means[:, k],
                    std,
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
        return out
