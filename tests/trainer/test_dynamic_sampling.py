"""DAPO's dynamic sampling at the rollout seam: zero-variance groups are dropped, the batch is
refilled to ``batch_size`` groups by further sampling rounds, and past ``max_rounds`` the run
stops with a line that says so; the trainer's refill asks the engine with ids no rollout uses."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from unirl.trainer.base import StageTrainer
from unirl.trainer.dynamic_sampling import (
    DynamicSamplingExhausted,
    fill_informative,
    informative_groups,
)
from unirl.types import RolloutTrack

SPP = 3


def _track(rewards_per_group: list[list[float]], first_group: int) -> RolloutTrack:
    """Groups of SPP samples with the given rewards; group ids from ``first_group``."""
    rewards = torch.tensor([r for group in rewards_per_group for r in group])
    n = len(rewards)
    groups = torch.arange(first_group, first_group + len(rewards_per_group))
    return RolloutTrack(
        sample_ids=torch.arange(first_group * SPP, first_group * SPP + n),
        group_ids=groups.repeat_interleave(SPP),
        prompts=[f"p{int(g)}" for g in groups.repeat_interleave(SPP)],
        rewards=rewards,
    )


ZERO, ONES, MIXED = [0.0] * SPP, [1.0] * SPP, [0.0, 1.0, 0.5]


def _zero_std_groups(track: RolloutTrack) -> int:
    _, metrics = track.compute_advantages(scope="group", std="group")
    return round(metrics["advantage/zero_std_ratio"] * len(torch.unique(track.group_ids)))


def test_refill_reaches_the_batch_size_and_never_keeps_a_zero_variance_group() -> None:
    """Round 0: 1 informative group of 4; each further round 2 of 4 (one all-right, one
    all-wrong): two extra rounds fill 4 groups, the second round's last group left out."""
    first = _track([ZERO, MIXED, ONES, ZERO], first_group=0)
    rounds: list[int] = []

    def more(r: int) -> RolloutTrack:
        rounds.append(r)
        return _track([MIXED, ONES, [2.0, 0.0, 0.0], ZERO], first_group=10 * r)

    track, metrics = fill_informative(first, more, groups_wanted=4, max_rounds=4)
    assert rounds == [1, 2]
    assert torch.unique(track.group_ids).tolist() == [1, 10, 12, 20]
    assert len(track) == 4 * SPP
    assert _zero_std_groups(track) == 0  # no group of equal rewards reaches training
    assert informative_groups(track) == [1, 10, 12, 20]
    assert metrics == {
        "dynamic_sampling/rounds": 2.0,
        "dynamic_sampling/sampled_groups": 12.0,
        "dynamic_sampling/dropped_groups": 7.0,  # 3 of round 0, 2 each of rounds 1 and 2
        "dynamic_sampling/kept_ratio": 5 / 12,
    }


def test_a_full_first_round_samples_nothing_more_and_keeps_its_order() -> None:
    first = _track([MIXED, [1.0, 0.0, 0.0], MIXED], first_group=0)
    track, metrics = fill_informative(
        first, lambda r: pytest.fail("no refill needed"), groups_wanted=2, max_rounds=1
    )
    assert track.sample_ids.tolist() == list(range(2 * SPP))
    assert metrics["dynamic_sampling/rounds"] == 0.0


def test_a_group_with_a_dropped_sample_is_not_kept() -> None:
    first = _track([MIXED, MIXED], first_group=0)
    first.status[1] = 1  # a reward failure dropped a sample of group 0
    assert informative_groups(first) == [1]


def test_running_out_of_rounds_raises_one_line_naming_the_knobs() -> None:
    first = _track([ZERO, MIXED], first_group=0)
    with pytest.raises(DynamicSamplingExhausted) as info:
        fill_informative(
            first, lambda r: _track([ONES, ZERO], first_group=10 * r), groups_wanted=2, max_rounds=2
        )
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "dynamic sampling: after 2 extra sampling round(s) (dynamic_sampling.max_rounds=2) "
        "only 1 of batch_size=2 prompt groups had rewards that differ (5 of 6 sampled groups "
        "scored all-equal)"
    )


def test_the_trainer_refills_through_its_engine_with_unused_ids() -> None:
    """``StageTrainer.refill_informative``: each extra round takes the next prompts, builds
    the request as rollout ``num_rollouts · r + index`` and scores the new track."""
    calls: list[tuple[list[str], int]] = []
    prompts = iter([["a", "b"], ["c", "d"]])

    def build_request(batch: list[str], index: int) -> SimpleNamespace:
        calls.append((batch, index))
        return SimpleNamespace(index=index)

    def generate(req: SimpleNamespace) -> SimpleNamespace:
        unscored = _track([MIXED, MIXED], first_group=100 * req.index)
        return SimpleNamespace(tracks={"text": dataclasses_replace(unscored, rewards=None)})

    scores = iter([ZERO + MIXED, MIXED + MIXED])  # round 1: one group informative; round 2: both

    def score_tracks(tracks: dict[str, RolloutTrack]) -> dict[str, float]:
        tracks["text"] = dataclasses_replace(tracks["text"], rewards=torch.tensor(next(scores)))
        return {}

    trainer = SimpleNamespace(
        stages=[SimpleNamespace(track="text")],
        cfg=SimpleNamespace(
            num_rollouts=50, batch_size=3, dynamic_sampling=SimpleNamespace(max_rounds=3)
        ),
        data_source=SimpleNamespace(next_batch=lambda: next(prompts)),
        build_request=build_request,
        rollout=SimpleNamespace(generate=generate),
        score_tracks=score_tracks,
        _sampling=lambda mode: contextlib.nullcontext(),
    )
    first = _track([ZERO, MIXED], first_group=14)
    tracks, metrics = StageTrainer.refill_informative(trainer, {"text": first}, 7)
    assert calls == [(["a", "b"], 57), (["c", "d"], 107)]
    out = tracks["text"]
    assert torch.unique(out.group_ids).tolist() == [15, 5701, 10700]
    assert _zero_std_groups(out) == 0
    assert metrics["dynamic_sampling/rounds"] == 2.0


def dataclasses_replace(track: RolloutTrack, **kw: object) -> RolloutTrack:
    return dataclasses.replace(track, **kw)  # type: ignore[arg-type]
