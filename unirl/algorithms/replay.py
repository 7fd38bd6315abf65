"""The replay machinery the ratio-based diffusion losses share (Flow-GRPO, Flow-DPPO).

π_old is anchored by replaying each trained slot with the current weights at the training
micro-batch geometry (:func:`replay_anchors`); the training pass replays every slot again,
one forward + backward per group of ``slots_per_forward`` slots (:func:`replay_slot_losses`,
the group's slots stacked as rows by :func:`slot_batches`), adding β·KL to the frozen
reference when ``kl`` is on (:func:`reference_step`, :func:`step_kl`). :func:`slot_sigmas`
gives σ of a trained slot, :func:`check_flow_knobs` validates the knobs these losses share and
:func:`ratio_metrics` summarises their ratios. A loss node brings only its per-slot term
(``policy_terms``) and its formula in ``losses.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

import torch
from torch.profiler import record_function

from unirl.algorithms.base import StepResult, TrainBackend
from unirl.algorithms.kl import KLController
from unirl.config.require import require
from unirl.models.common.denoise import StepRecord, sigma_max_of
from unirl.models.common.guidance import CFG_GRADIENTS, CFGGradient, guided
from unirl.models.common.protocols import FlowMatchingFamily
from unirl.sde import SDEStrategy
from unirl.sde.kernels import KLForm
from unirl.types import Conditions, LatentSegment, host_to_device


class ReplayPipeline(FlowMatchingFamily, Protocol):
    """The diffusion pipeline a loss node replays through
    (``unirl.models.common.pipeline.FlowMatchingPipeline`` provides it): a family plus the
    rollout's SDE strategy and the replay of one trained slot."""

    @property
    def strategy(self) -> SDEStrategy: ...

    def replay(
        self,
        conditions: Conditions,
        segment: LatentSegment,
        slot: int,
        *,
        cfg_gradient: CFGGradient = "both",
        reuse_uncond: bool = False,
    ) -> StepRecord: ...


class ReferenceHolder(Protocol):
    """A loss node that can switch its module to the frozen reference policy."""

    def reference(self) -> AbstractContextManager[None]: ...


class ReplayLoss(ReferenceHolder, Protocol):
    """What :func:`replay_slot_losses` reads from its loss node (Flow-GRPO, Flow-DPPO)."""

    @property
    def pipeline(self) -> ReplayPipeline: ...

    @property
    def backend(self) -> TrainBackend | None: ...

    @property
    def kl_controller(self) -> KLController: ...

    @property
    def cfg_gradient(self) -> CFGGradient: ...

    @property
    def kl_form(self) -> KLForm: ...

    @property
    def slots_per_forward(self) -> int: ...


def check_flow_knobs(
    kl_form: str,
    old_logp_source: str,
    cfg_gradient: str = "cond_only",
    sources: tuple[str, ...] = ("replay", "rollout"),
) -> None:
    """Validate the knobs every replay-based diffusion loss shares; ``sources``: the
    ``old_logp_source`` values the loss takes."""
    require(
        cfg_gradient in CFG_GRADIENTS,
        "algorithm.cfg_gradient must be 'cond_only' (flow_grpo: no gradient through the "
        "unconditional prediction) or 'both' (gradient through both CFG halves)",
    )
    require(
        kl_form in ("gaussian", "reference"), "algorithm.kl_form must be 'gaussian' or 'reference'"
    )
    require(
        old_logp_source in sources,
        f"algorithm.old_logp_source must be one of {', '.join(map(repr, sources))}, got "
        f"{old_logp_source!r}",
    )


def check_slots_per_forward(slots_per_forward: int) -> None:
    """``slots_per_forward`` (trained slots per forward + backward) is an integer >= 1."""
    require(
        isinstance(slots_per_forward, int) and slots_per_forward >= 1,
        "algorithm.slots_per_forward must be an integer >= 1 (trained slots replayed in one "
        f"forward + backward; 1 keeps one slot per forward), got {slots_per_forward!r}",
    )


def gather_slots(
    conditions: Conditions, segment: LatentSegment, first: int, stop: int
) -> tuple[Conditions, LatentSegment, int]:
    """Trained slots ``first … stop-1`` of every sample stacked as the rows of one batch, so
    a single forward replays them all: ``(conditions, segment, slot)`` with ``G·B`` rows of
    one slot each (G = ``stop - first``), slot-major (rows ``j·B … (j+1)·B`` are slot
    ``first + j``; see :func:`record_rows`), and the slot to replay (0). One slot is
    returned as it is; ``conditions`` must already be repeated G times (slot-major)."""
    if stop - first == 1:
        return conditions, segment, first

    def rows(t: torch.Tensor) -> torch.Tensor:  # [N, S, ...] -> [G·N, 1, ...]
        return t[:, first:stop].transpose(0, 1).reshape(-1, 1, *t.shape[2:])

    def optional_rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else rows(t)

    stacked = dataclasses.replace(
        segment,
        sde_indices=rows(segment.sde_indices),
        latents=optional_rows(segment.latents),
        next_latents=optional_rows(segment.next_latents),
        final_latents=None,  # replay never reads x₀
        sde_logp=optional_rows(segment.sde_logp),
        sde_means=optional_rows(segment.sde_means),
        sde_uncond=optional_rows(segment.sde_uncond),
    )
    return conditions, stacked, 0


def slot_batches(
    conditions: Conditions, segment: LatentSegment, size: int
) -> Iterator[tuple[list[int], Conditions, LatentSegment, int]]:
    """The trained slots in consecutive groups of ``size`` (the last may be smaller), each as
    ``(slots, conditions, segment, slot)``: the batch one forward replays
    (:func:`gather_slots`; the conditions are repeated once per group size)."""
    repeated: dict[int, Conditions] = {1: conditions}
    for first in range(0, segment.num_sde_steps, size):
        stop = min(first + size, segment.num_sde_steps)
        g = stop - first
        if g not in repeated:
            repeated[g] = type(conditions).concat([conditions] * g)
        yield (list(range(first, stop)), *gather_slots(repeated[g], segment, first, stop))


def record_rows(record: StepRecord, part: int, parts: int) -> StepRecord:
    """Part ``part`` of ``parts`` equal row blocks of a grouped replay (:func:`slot_batches`):
    the record of one slot of the group."""
    if parts == 1:
        return record

    def cut(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return t
        if t.ndim == 0 or t.shape[0] % parts:
            raise ValueError(
                f"a replay of {parts} stacked slots must give per-row tensors, got shape "
                f"{tuple(t.shape)}"
            )
        n = t.shape[0] // parts
        return t[part * n : (part + 1) * n]

    mean = cut(record.mean)
    assert mean is not None
    std = cut(record.std)
    assert std is not None
    return StepRecord(log_prob=cut(record.log_prob), mean=mean, std=std)


def check_record_uncond(pipeline: object, cfg_gradient: str) -> None:
    """A recorded unconditional velocity carries no gradient: only ``cond_only`` may use it."""
    require(
        not getattr(pipeline, "record_uncond", False) or cfg_gradient == "cond_only",
        "pipeline.record_uncond=true reuses the rollout's unconditional velocity, which carries "
        "no gradient; it needs algorithm.cfg_gradient=cond_only (or set record_uncond=false)",
    )


def reuses_uncond(algorithm: ReplayLoss, segment: LatentSegment) -> bool | None:
    """Whether the trained steps of ``segment`` take v_u from the rollout (``True``: the policy
    version the rollout stamped is the backend's current one), recompute it without grad
    (``False``: an optimizer step since, or no version known), or neither applies (``None``: no
    recorded v_u, no guidance, or ``cfg_gradient=both``). Checked, never assumed."""
    if (
        segment.sde_uncond is None
        or not guided(segment.guidance_scale)
        or algorithm.cfg_gradient != "cond_only"
    ):
        return None
    version = getattr(algorithm.backend, "policy_version", None)
    return version is not None and segment.uncond_version >= 0 and segment.uncond_version == version


def uncond_metrics(terms: dict[str, torch.Tensor]) -> dict[str, float]:
    """``uncond_reused`` / ``uncond_recomputed``: trained-step replays whose v_u came from the
    rollout / from a no-grad forward (only when the rollout recorded v_u)."""
    if "uncond_reused" not in terms:
        return {}
    reused = float(terms["uncond_reused"].sum())
    return {
        "uncond_reused": reused,
        "uncond_recomputed": float(terms["uncond_reused"].numel()) - reused,
    }


@torch.no_grad()
def replay_anchors(
    pipeline: ReplayPipeline,
    conditions: Conditions,
    segment: LatentSegment,
    *,
    means: bool,
    cfg_gradient: CFGGradient = "both",
    reuse_uncond: bool = False,
    slots_per_forward: int = 1,
) -> LatentSegment:
    """π_old of every trained slot, replayed with the current weights at this micro-batch's
    geometry: ``sde_logp[B, S]`` and, when ``means``, ``sde_means[B, S, C, h, w]`` (fp32).
    ``cfg_gradient`` and ``slots_per_forward`` must be the training forward's, so the anchor
    runs the same forwards (the split no-grad unconditional one for ``cond_only``, the same
    slot groups) and the first ratio is exactly 1; ``reuse_uncond`` (see
    :func:`reuses_uncond`) likewise takes v_u from the rollout."""
    logps: list[torch.Tensor] = []
    mus: list[torch.Tensor] = []
    for group, cond_g, seg_g, at in slot_batches(conditions, segment, slots_per_forward):
        grouped = pipeline.replay(
            cond_g, seg_g, at, cfg_gradient=cfg_gradient, reuse_uncond=reuse_uncond
        )
        for j in range(len(group)):
            record = record_rows(grouped, j, len(group))
            logps.append(replayed_log_prob(record, pipeline.strategy))
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
    algorithm: ReferenceHolder,
    pipeline: ReplayPipeline,
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
    algorithm: ReplayLoss,
    conditions: Conditions,
    segment: LatentSegment,
    loss_scale: float,
    policy_terms: Callable[[int, StepRecord], tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> StepResult:
    """The per-slot training loop the replay losses share (Flow-GRPO, Flow-DPPO).

    For each group of ``algorithm.slots_per_forward`` trained slots (:func:`slot_batches`,
    stacked as rows): the reference replay when the KL is on (no
    grad, the family's plain guided forward), the policy replay with
    ``algorithm.cfg_gradient`` (v_u taken from the rollout while :func:`reuses_uncond` says
    so, counted in ``uncond_reused[S]``), then per slot ``k`` of the group
    ``policy_terms(k, record) -> (policy loss, per-slot terms)`` plus ``β·KL`` of the step,
    and one backward of the group's summed losses scaled by ``loss_scale / S`` (one group's
    graph alive at a time: activation memory grows with the group). Grouping changes the
    forward's batch geometry, not the loss: each slot keeps its own terms. Terms are
    concatenated over slots; with the KL on, ``kl`` and ``kl_steps[B, S]`` are added. The
    loss comes back as a detached device scalar (no host sync per slot).
    """
    num_steps = segment.num_sde_steps
    kl = algorithm.kl_controller
    total: torch.Tensor | float = 0.0
    parts: dict[str, list[torch.Tensor]] = {}
    kls: list[torch.Tensor] = []
    reuse = reuses_uncond(algorithm, segment)  # one optimizer step never happens mid-batch
    for group, cond_g, seg_g, at in slot_batches(conditions, segment, algorithm.slots_per_forward):
        ref = None
        if kl.enabled:
            with record_function("unirl/train/reference"):
                ref = reference_step(algorithm, algorithm.pipeline, cond_g, seg_g, at)
        group_loss: torch.Tensor | None = None
        with record_function("unirl/train/policy_forward"):
            grouped = algorithm.pipeline.replay(
                cond_g, seg_g, at, cfg_gradient=algorithm.cfg_gradient, reuse_uncond=bool(reuse)
            )
            for j, k in enumerate(group):
                record = record_rows(grouped, j, len(group))
                loss, terms = policy_terms(k, record)
                if reuse is not None:
                    terms = {**terms, "uncond_reused": torch.tensor([float(reuse)])}
                if ref is not None:
                    ref_mean = record_rows(ref, j, len(group)).mean
                    step = step_kl(
                        algorithm.pipeline.strategy,
                        record.mean,
                        ref_mean,
                        segment,
                        k,
                        algorithm.kl_form,
                    )
                    loss = loss + kl.beta * step.mean()
                    kls.append(step.detach())
                    kl.observe(step)
                group_loss = loss if group_loss is None else group_loss + loss
                total = total + loss.detach() / num_steps
                for name, value in terms.items():
                    parts.setdefault(name, []).append(value)
        assert group_loss is not None
        with record_function("unirl/train/backward"):
            (group_loss * (loss_scale / num_steps)).backward()
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
