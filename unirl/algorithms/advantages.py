"""Advantage options beyond ``RolloutTrack.compute_advantages`` (which owns the run-level
group/batch-std GRPO advantage): per-component normalisation for multi-reward runs."""

from __future__ import annotations

import torch
from torch import Tensor

from unirl.config.require import require


def _standardise(values: Tensor, eps: float) -> Tensor:
    """``(v − mean) / (std + eps)`` with the population std; a constant set gives 0."""
    if values.numel() == 0 or float(values.max() - values.min()) == 0.0:
        return torch.zeros_like(values)
    return (values - values.mean()) / (values.std(unbiased=False) + eps)


def gdpo_advantages(
    component_rewards: dict[str, Tensor],
    weights: dict[str, float],
    group_ids: Tensor,
    eps: float = 1e-6,
    *,
    batch_norm: bool = True,
    kept: Tensor | None = None,
) -> Tensor:
    """GDPO-style advantages ``[N]`` (fp32): normalise each reward component within its group,
    then take the weighted sum, then (``batch_norm``) standardise the sum over the batch.

        A_k,i = (R_k,i − mean_g(i) R_k) / (std_g(i) R_k + eps)
        S_i   = Σ_k w_k · A_k,i
        A_i   = (S_i − mean S) / (std S + eps)        if batch_norm else S_i

    Normalising before weighting keeps a high-variance component from drowning the others
    (summing raw rewards first collapses distinct reward combinations onto one advantage).
    Stds are population stds; a group (or batch) whose values are all equal gives 0.
    ``kept[N]`` (bool) excludes dropped samples from every statistic; they get 0.
    """
    require(len(component_rewards) > 0, "gdpo_advantages needs at least one reward component")
    require(
        set(weights) == set(component_rewards),
        f"gdpo weights {sorted(weights)} must name exactly the reward components {sorted(component_rewards)}",
    )
    require(eps >= 0, f"gdpo eps must be >= 0, got {eps}")
    groups = group_ids.detach().cpu()
    n = groups.numel()
    keep = torch.ones(n, dtype=torch.bool) if kept is None else kept.detach().cpu().bool()
    total = torch.zeros(n, dtype=torch.float64)
    for name, rewards in component_rewards.items():
        r = rewards.detach().cpu().to(torch.float64).reshape(-1)
        require(r.numel() == n, f"component reward {name!r} has {r.numel()} values for {n} samples")
        if not torch.isfinite(r[keep]).all():
            raise ValueError(f"component reward {name!r} has non-finite values for kept samples")
        adv = torch.zeros(n, dtype=torch.float64)
        for gid in torch.unique(groups[keep]).tolist():
            members = (groups == gid) & keep
            adv[members] = _standardise(r[members], eps)
        total += float(weights[name]) * adv
    if batch_norm:
        out = torch.zeros_like(total)
        out[keep] = _standardise(total[keep], eps)
        total = out
    device = next(iter(component_rewards.values())).device
    return total.to(torch.float32).to(device)
