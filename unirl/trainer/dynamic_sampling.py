"""DAPO's dynamic sampling at the rollout seam (Yu et al., 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", §3.2; docs/math.md, "DAPO").

A prompt group whose rewards are all equal (zero variance: every sample right, or every one
wrong) has zero group-relative advantage, so it only dilutes the batch. With
``dynamic_sampling.enabled`` the trainer keeps the groups whose rewards differ, asks for
more prompts (another generate + reward call) until ``batch_size`` such groups are in hand,
and trains on exactly those; ``dynamic_sampling.max_rounds`` caps the extra calls of one
rollout and past it the run stops with an error that says so (:func:`fill_informative`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from unirl.config.require import UserFacingError
from unirl.types import RolloutTrack


class DynamicSamplingExhausted(UserFacingError):
    """``max_rounds`` extra sampling rounds did not find ``batch_size`` informative groups."""


def informative_groups(track: RolloutTrack) -> list[int]:
    """Group ids (in the order they first appear) whose samples are all kept and whose rewards
    are not all equal."""
    if track.rewards is None:
        raise ValueError("dynamic sampling needs a scored track (rewards), got none")
    groups = track.group_ids.cpu()
    rewards = track.rewards.detach().cpu().double()
    kept = track.kept.cpu()
    out: list[int] = []
    for gid in dict.fromkeys(groups.tolist()):
        members = groups == gid
        vals = rewards[members]
        if bool(kept[members].all()) and float(vals.max() - vals.min()) > 0.0:
            out.append(int(gid))
    return out


def fill_informative(
    first: RolloutTrack,
    sample_more: Callable[[int], RolloutTrack],
    *,
    groups_wanted: int,
    max_rounds: int,
) -> tuple[RolloutTrack, dict[str, float]]:
    """The first ``groups_wanted`` informative groups of ``first``, then of
    ``sample_more(1)``, ``sample_more(2)``, … (each a freshly sampled and scored track with
    group ids of its own), concatenated: exactly ``groups_wanted`` groups, none of them of
    equal rewards. Raises :class:`DynamicSamplingExhausted` when ``max_rounds`` extra rounds
    do not find them. Metrics: ``dynamic_sampling/rounds`` (extra rounds taken),
    ``…/sampled_groups``, ``…/dropped_groups`` (zero variance or with a dropped sample),
    ``…/kept_ratio`` (informative / sampled)."""
    parts: list[RolloutTrack] = []
    have, sampled, informative, rounds = 0, 0, 0, 0
    track = first
    while True:
        good = informative_groups(track)
        sampled += len(torch.unique(track.group_ids))
        informative += len(good)
        take = good[: groups_wanted - have]
        if take:
            rows = torch.isin(track.group_ids.cpu(), torch.tensor(take)).nonzero().flatten()
            parts.append(track.select(rows))
            have += len(take)
        if have >= groups_wanted:
            break
        if rounds >= max_rounds:
            raise DynamicSamplingExhausted(
                f"dynamic sampling: after {rounds} extra sampling round(s) (dynamic_sampling."
                f"max_rounds={max_rounds}) only {have} of batch_size={groups_wanted} prompt "
                f"groups had rewards that differ ({sampled - informative} of {sampled} sampled "
                "groups scored all-equal); raise dynamic_sampling.max_rounds or "
                "sampling.samples_per_prompt, or set dynamic_sampling.enabled=false"
            )
        rounds += 1
        track = sample_more(rounds)
    metrics = {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/sampled_groups": float(sampled),
        "dynamic_sampling/dropped_groups": float(sampled - informative),
        "dynamic_sampling/kept_ratio": informative / sampled if sampled else 0.0,
    }
    return RolloutTrack.concat(parts), metrics
