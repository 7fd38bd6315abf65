"""Adapting a serving engine's trajectory outputs into the rollout contract.

External engines (SGLang, vLLM-Omni) return per-sample dense trajectories
(``latents[N, T+1, *latent]``: x at every σ of the schedule, the last one the clean sample, in
our latent layout once the family's engine maps converted it),
their own σ schedule and per-step log-probs. These helpers check them against the request
(same σ schedule; same x_T or, by policy, record the engine's own) and cut the sparse
``LatentSegment`` training replays from. Nothing backend-specific leaves this module.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.types import DiffusionRequest, LatentSegment


class EngineContractError(RuntimeError):
    """An engine's output does not satisfy the rollout contract (shapes, σ, x_T, log-probs)."""


def check_sigmas(
    engine: str, got: torch.Tensor | None, stage: DiffusionRequest, *, atol: float = 1e-5
) -> None:
    """The engine must have used the request's σ schedule (``stage.sigmas[T+1]``)."""
    if got is None:
        raise EngineContractError(
            f"{engine}: the engine returned no σ schedule; cannot check it against the request"
        )
    got = got.detach().float().cpu().reshape(-1)
    want = stage.sigmas.detach().float().cpu().reshape(-1)
    if got.shape != want.shape or not torch.allclose(got, want, atol=atol, rtol=0.0):
        raise EngineContractError(
            f"{engine}: sampled with σ = {[round(x, 5) for x in got.tolist()]} but the request pins "
            f"{[round(x, 5) for x in want.tolist()]}; align the server's scheduler (shift / steps) with "
            "the recipe so every engine uses the driver's schedule"
        )


def segment_from_trajectory(
    *,
    engine: str,
    stage: DiffusionRequest,
    seed: int,
    trajectory: torch.Tensor,
    log_probs: torch.Tensor | None,
    guidance_scale: float,
    strategy: str,
    storage_dtype: torch.dtype = torch.float32,
    init_noise: str = "verify",
    atol: float = 0.0,
) -> LatentSegment:
    """The sparse segment of ``trajectory[N, T+1, *latent]`` at the stage's SDE steps.

    ``stage`` is the request's ``DiffusionRequest`` and ``seed`` the request's seed (its x_T).
    ``log_probs``: ``[N, T]`` (every step; gathered at ``sde_indices``) or ``[N, S]`` (only
    the SDE steps, in order). ``init_noise``: ``verify`` (``trajectory[:, 0]`` must equal the
    request's x_T within ``atol``) or ``record`` (the engine drew its own x_T; the segment keeps
    the engine's latents, so training replays what was sampled).
    """
    n, s = stage.sde_indices.shape
    steps = stage.num_steps
    if trajectory.ndim < 3 or tuple(trajectory.shape[:2]) != (n, steps + 1):
        raise EngineContractError(
            f"{engine}: trajectory must be [N={n}, T+1={steps + 1}, ...], got {list(trajectory.shape)}"
        )
    if tuple(trajectory.shape[2:]) != stage.init_noise_shape:
        raise EngineContractError(
            f"{engine}: latent shape {list(trajectory.shape[2:])} differs from the request's {list(stage.init_noise_shape)}"
        )
    if init_noise not in ("verify", "record"):
        raise ValueError(f"init_noise must be 'verify' or 'record', got {init_noise!r}")
    traj = trajectory.detach().cpu()
    if init_noise == "verify":
        x_t = stage.initial_noise(seed)
        if not torch.allclose(traj[:, 0].float(), x_t, atol=atol, rtol=0.0):
            worst = (traj[:, 0].float() - x_t).abs().max().item()
            raise EngineContractError(
                f"{engine}: the engine started from a different x_T than the request's (max |Δ| = {worst:.3e}); "
                "pin the latents in the engine call or set the adapter's init_noise: record"
            )
    rows = torch.arange(n).unsqueeze(1).expand(n, s)
    idx = stage.sde_indices.cpu()
    latents = traj[rows, idx].to(storage_dtype)
    next_latents = traj[rows, idx + 1].to(storage_dtype)
    sde_logp = None
    if log_probs is not None:
        lp = log_probs.detach().float().cpu()
        if tuple(lp.shape) == (n, steps):
            sde_logp = lp[rows, idx]
        elif tuple(lp.shape) == (n, s):
            sde_logp = lp
        else:
            raise EngineContractError(
                f"{engine}: log-probs must be [N={n}, T={steps}] or [N={n}, S={s}], got {list(lp.shape)}"
            )
        if not torch.isfinite(sde_logp).all():
            raise EngineContractError(f"{engine}: non-finite per-step log-probs at the SDE steps")
    return LatentSegment(
        sigmas=stage.sigmas.detach().float().cpu(),
        sde_indices=idx.clone(),
        latents=latents,
        next_latents=next_latents,
        final_latents=traj[:, -1].to(storage_dtype),
        sde_logp=sde_logp,
        guidance_scale=float(guidance_scale),
        strategy=strategy,
    )


def pixels_from_output(images: Any) -> torch.Tensor:
    """``pixels[N, 3, H, W]`` float32 in [0, 1] from a list / tensor of images given as
    ``[3, H, W]`` or ``[H, W, 3]``, uint8 (0..255) or float (0..1)."""
    if isinstance(images, torch.Tensor):
        batch = images
    else:
        batch = torch.stack([torch.as_tensor(im) for im in images])
    if batch.ndim != 4:
        raise EngineContractError(
            f"images must be a batch of [3, H, W] or [H, W, 3], got {list(batch.shape)}"
        )
    if batch.shape[1] != 3 and batch.shape[-1] == 3:
        batch = batch.permute(0, 3, 1, 2)
    if batch.dtype == torch.uint8:
        return batch.float() / 255.0
    return batch.float().clamp(0.0, 1.0)


def prompt_groups(prompts: list[str], sde_indices: torch.Tensor) -> list[list[int]]:
    """Runs of consecutive rows sharing prompt and SDE steps (one engine call each)."""
    groups: list[list[int]] = []
    for i in range(len(prompts)):
        if (
            groups
            and prompts[i] == prompts[groups[-1][0]]
            and torch.equal(sde_indices[i], sde_indices[groups[-1][0]])
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
