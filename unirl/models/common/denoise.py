"""The flow-matching denoise loop, written once for every diffusion family.

Sampling walks the pinned σ schedule; at the SDE steps of each sample (``sde_indices``) it
takes a stochastic kernel step and records ``log p`` (and optionally the Gaussian mean);
elsewhere it takes the deterministic Euler step. Only the trained steps' inputs and outputs
are stored (sparse trajectory). Replay recomputes one stored step at training geometry.

Numerics: the carried latent is rounded to the storage dtype after every step, so the value
the model saw during sampling is exactly the value replay feeds it; kernels do fp32 math and
take ``log p`` of the *rounded* next latent. Hence replaying an unchanged policy reproduces
``sde_logp`` bit for bit at equal batch geometry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from unirl.models.common.guidance import CFGGradient, guidance_of, guided
from unirl.models.common.protocols import FlowMatchingFamily
from unirl.sde.kernels import SDEStrategy
from unirl.types import Conditions, LatentSegment, host_to_device


def forward_conditions(
    family: FlowMatchingFamily, conditions: Conditions, guidance_scale: float
) -> object:
    """What the velocity forwards of one loop (or one replayed micro-batch) consume, as the
    family's guidance builds it: CFG pairs (2·N rows), a (cond, uncond) pair, or plain rows."""
    return guidance_of(family).forward_conditions(family, conditions, guidance_scale)


def guided_velocity(
    family: FlowMatchingFamily,
    latents: torch.Tensor,
    sigma: torch.Tensor,
    fwd_conditions: object,
    guidance_scale: float,
    *,
    cfg_gradient: CFGGradient = "both",
    v_uncond: torch.Tensor | None = None,
    uncond_out: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """fp32 velocity ``v[B, ...]`` through the family's guidance (sampling and replay alike).

    ``fwd_conditions`` comes from :func:`forward_conditions`; ``cfg_gradient``, ``v_uncond``
    (a reused unconditional velocity) and ``uncond_out`` (record it): see
    ``unirl.models.common.guidance``.
    """
    return guidance_of(family).velocity(
        family,
        latents,
        sigma,
        fwd_conditions,
        guidance_scale,
        cfg_gradient=cfg_gradient,
        v_uncond=v_uncond,
        uncond_out=uncond_out,
    )


def sigma_max_of(sigmas: torch.Tensor) -> float | None:
    """The first σ below 1, used by kernels whose noise scale diverges at σ = 1."""
    below = sigmas[sigmas < 1.0]
    return float(below[0]) if below.numel() else None


@dataclass
class StepRecord:
    """One replayed step: ``log_prob[B]`` (mean over C·H·W), ``mean[B, ...]``, ``std[B]`` (fp32)."""

    log_prob: torch.Tensor | None
    mean: torch.Tensor
    std: torch.Tensor


def _step_positions(sde_indices: torch.Tensor, num_steps: int) -> torch.Tensor:
    """``pos[T, N]``: for step j and sample i the slot k with ``sde_indices[i, k] == j``, else -1."""
    n, s = sde_indices.shape
    pos = torch.full((num_steps, n), -1, dtype=torch.long)
    rows = torch.arange(n).unsqueeze(1).expand(n, s)
    pos[sde_indices.reshape(-1), rows.reshape(-1)] = torch.arange(s).repeat(n)
    return pos


@torch.no_grad()
def sample_trajectory(
    family: FlowMatchingFamily,
    *,
    conditions: Conditions,
    x_T: torch.Tensor,
    sigmas: torch.Tensor,
    sde_indices: torch.Tensor,
    sde_noise: torch.Tensor | Callable[[], torch.Tensor] | None,
    strategy: SDEStrategy,
    guidance_scale: float,
    storage_dtype: torch.dtype = torch.float32,
    record_means: bool = False,
    record_uncond: bool = False,
    policy_version: int = -1,
) -> LatentSegment:
    """Run the full denoise loop from ``x_T[N, C, h, w]`` along ``sigmas[T+1]``.

    ``sde_indices[N, S]`` (CPU) names each sample's stochastic steps; ``sde_noise[N, S, C, h, w]``
    holds the driver-seeded noise for them (None when ``S == 0``), or a callable returning it,
    called once, when the first SDE step needs it: the forwards before that step are already
    queued on the device while the host finishes drawing it (``FlowMatchingPipeline``
    draws it on a background thread). Returns a ``LatentSegment``
    on ``x_T``'s device with ``latents``/``next_latents`` at the SDE steps, ``sde_logp[N, S]``
    when the strategy provides log-probs, ``sde_means`` when asked, and ``final_latents``.
    ``record_uncond`` (guided runs only) stores the unconditional velocity of every SDE step
    in ``sde_uncond`` (fp32), stamped with ``policy_version``.
    """
    device = x_T.device
    sigmas_cpu = sigmas.detach().float().cpu()
    sigmas_dev = sigmas_cpu.to(device)
    num_steps = sigmas_cpu.numel() - 1
    n, s = sde_indices.shape
    positions = _step_positions(sde_indices.cpu(), num_steps)
    is_sde = positions >= 0  # [T, N], on the host: no device sync in the loop
    sigma_max = sigma_max_of(sigmas_cpu)
    fwd_cond = forward_conditions(family, conditions, guidance_scale)

    latent_shape = tuple(x_T.shape[1:])
    buf_in = torch.empty((n, s, *latent_shape), dtype=storage_dtype, device=device)
    buf_out = torch.empty_like(buf_in)
    logp = torch.zeros((n, s), dtype=torch.float32, device=device)
    means = (
        torch.empty((n, s, *latent_shape), dtype=torch.float32, device=device)
        if record_means
        else None
    )
    provides_logp = bool(getattr(strategy, "provides_log_prob", True))
    record_uncond = record_uncond and guided(guidance_scale)
    # fp32 whatever the storage dtype: v_u enters μ scaled by (1 − g)·Δ/std², and bf16's
    # rounding of it moved log p by 1.1e-3 on the test family (ten times a 1e-4 clip range)
    uncond = (
        torch.empty((n, s, *latent_shape), dtype=torch.float32, device=device)
        if record_uncond
        else None
    )
    uncond_out: list[torch.Tensor] | None = [] if record_uncond else None

    # index tensors of every SDE step, on the device before the loop: no copies inside it
    step_rows = [positions[j].ge(0).nonzero().squeeze(1) for j in range(num_steps)]
    step_slots = [positions[j, r] for j, r in enumerate(step_rows)]
    rows_on_device = [host_to_device(r, device) for r in step_rows]
    slots_on_device = [host_to_device(s_, device) for s_ in step_slots]
    noise_dev: torch.Tensor | None = None

    x = x_T.to(storage_dtype)
    for j in range(num_steps):
        sigma = sigmas_dev[j].expand(n)
        sigma_next = sigmas_dev[j + 1].expand(n)
        v = guided_velocity(family, x, sigma, fwd_cond, guidance_scale, uncond_out=uncond_out)
        v_u = uncond_out.pop() if uncond_out else None
        ode_next = (x.float() + v * (sigma_next - sigma).view(-1, *([1] * (x.ndim - 1)))).to(
            storage_dtype
        )
        step_mask = is_sde[j]
        if not bool(step_mask.any()):
            x = ode_next
            continue
        rows_dev, slots_dev = rows_on_device[j], slots_on_device[j]
        if sde_noise is not None and noise_dev is None:
            noise_dev = host_to_device(sde_noise() if callable(sde_noise) else sde_noise, device)
        noise = noise_dev[rows_dev, slots_dev] if noise_dev is not None else None
        out = strategy.step(
            v.index_select(0, rows_dev),
            x.index_select(0, rows_dev),
            sigma.index_select(0, rows_dev),
            sigma_next.index_select(0, rows_dev),
            noise=noise,
            storage_dtype=storage_dtype,
            sigma_max=sigma_max,
        )
        buf_in[rows_dev, slots_dev] = x.index_select(0, rows_dev)
        buf_out[rows_dev, slots_dev] = out.next_latents.to(storage_dtype)
        if provides_logp and out.log_prob is not None:
            logp[rows_dev, slots_dev] = out.log_prob.float()
        if means is not None:
            means[rows_dev, slots_dev] = out.mean.float()
        if uncond is not None and v_u is not None:
            uncond[rows_dev, slots_dev] = v_u.index_select(0, rows_dev)
        if bool(step_mask.all()):
            x = out.next_latents.to(storage_dtype)
        else:
            x = ode_next.index_copy(0, rows_dev, out.next_latents.to(storage_dtype))

    return LatentSegment(
        sigmas=sigmas_cpu,
        sde_indices=sde_indices.cpu(),
        latents=buf_in,
        next_latents=buf_out,
        final_latents=x,
        sde_logp=logp if provides_logp else None,
        sde_means=means,
        sde_uncond=uncond,
        uncond_version=int(policy_version) if uncond is not None else -1,
        guidance_scale=float(guidance_scale),
        strategy=str(getattr(strategy, "name", type(strategy).__name__)),
    )


def replay_step(
    family: FlowMatchingFamily,
    *,
    fwd_conditions: object,
    segment: LatentSegment,
    slot: int,
    strategy: SDEStrategy,
    cfg_gradient: CFGGradient = "both",
    reuse_uncond: bool = False,
) -> StepRecord:
    """Recompute trained slot ``slot`` of every sample in ``segment`` under the current weights.

    Autograd follows the caller's grad mode. ``fwd_conditions`` is
    ``forward_conditions(family, conditions, segment.guidance_scale)`` for the same rows.
    ``cfg_gradient="cond_only"`` runs the unconditional rows as their own no-grad forward
    (a different batch geometry from sampling's batched CFG: bit-equal to the rollout's
    log-probs only where the model's rows do not depend on the batch they run in).
    ``reuse_uncond`` takes the unconditional velocity from ``segment.sde_uncond`` instead of
    a forward (the caller checks that the policy is the one that recorded it).
    """
    assert segment.latents is not None and segment.next_latents is not None
    device = segment.latents.device
    step_index = segment.sde_indices[:, slot]
    sigmas = segment.sigmas.float()
    sigma = host_to_device(sigmas[step_index], device)
    sigma_next = host_to_device(sigmas[step_index + 1], device)
    x = segment.latents[:, slot]
    v_uncond = None
    if reuse_uncond:
        if segment.sde_uncond is None:
            raise ValueError("reuse_uncond needs segment.sde_uncond (pipeline.record_uncond)")
        v_uncond = segment.sde_uncond[:, slot]
    v = guided_velocity(
        family,
        x,
        sigma,
        fwd_conditions,
        segment.guidance_scale,
        cfg_gradient=cfg_gradient,
        v_uncond=v_uncond,
    )
    out = strategy.step(
        v,
        x,
        sigma,
        sigma_next,
        prev_sample=segment.next_latents[:, slot],
        storage_dtype=segment.next_latents.dtype,
        sigma_max=sigma_max_of(sigmas),
    )
    return StepRecord(log_prob=out.log_prob, mean=out.mean, std=out.std)
