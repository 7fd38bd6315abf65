"""Advantage options beyond ``RolloutTrack.compute_advantages`` (which owns the run-level
group/batch-std GRPO advantage): per-component normalisation for multi-reward runs, and
:func:`advantages_for`, the one call the trainer makes to turn a scored track into advantages."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from unirl.config.require import ConfigError, require
from unirl.config.run import AdvantageConfig
from unirl.types import RolloutTrack


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


def advantages_for(
    track: RolloutTrack, cfg: AdvantageConfig
) -> tuple[RolloutTrack, dict[str, float]]:
    """The scored ``track`` with ``advantages[N]`` (fp32) attached, and ``advantage/*`` metrics.

    Without ``cfg.component_weights``: ``track.compute_advantages(scope, std, eps, clip)``.
    With them: :func:`gdpo_advantages` over the named components of
    ``track.component_rewards`` (dropped samples excluded, they get 0), clipped to ±``clip``.
    Metrics are the same keys either way: ``advantage/mean|std|abs_max`` over kept samples and
    ``advantage/zero_std_ratio`` (GDPO: the fraction of groups in which every component with a
    weight > 0 is constant, i.e. whose advantage is 0 before batch renormalisation).
    Raises ``ConfigError`` when a weighted component is not among the reward's components.
    """
    weights = cfg.component_weights
    if weights is None:
        return track.compute_advantages(scope=cfg.scope, std=cfg.std, eps=cfg.eps, clip=cfg.clip)
    available = dict(track.component_rewards or {})
    missing = sorted(set(weights) - set(available))
    if missing:
        raise ConfigError(
            f"advantage.component_weights names {missing}, which the reward does not produce "
            f"(its components: {sorted(available) or 'none; a single scorer has no components'}); "
            "use those names or set advantage.component_weights=null"
        )
    components = {name: available[name] for name in weights}
    kept = track.kept.cpu()
    adv = gdpo_advantages(
        components,
        weights,
        track.group_ids,
        cfg.eps,
        batch_norm=cfg.component_batch_norm,
        kept=kept,
    ).cpu()
    if cfg.clip is not None:
        adv = adv.clamp(-cfg.clip, cfg.clip)
    groups = track.group_ids.detach().cpu()
    weighted = [
        components[n].detach().cpu().double().reshape(-1) for n, w in weights.items() if w > 0
    ]
    group_list = torch.unique(groups[kept]).tolist()
    zero = 0
    for gid in group_list:
        members = (groups == gid) & kept
        zero += all(float(r[members].max() - r[members].min()) == 0.0 for r in weighted)
    kept_adv = adv[kept].double()
    metrics = {
        "advantage/mean": float(kept_adv.mean()) if kept_adv.numel() else 0.0,
        "advantage/std": float(kept_adv.std(unbiased=False)) if kept_adv.numel() > 1 else 0.0,
        "advantage/abs_max": float(kept_adv.abs().max()) if kept_adv.numel() else 0.0,
        "advantage/zero_std_ratio": zero / max(len(group_list), 1),
    }
    device = track.rewards.device if track.rewards is not None else adv.device
    return dataclasses.replace(track, advantages=adv.to(device)), metrics
