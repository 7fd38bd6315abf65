"""Reward overlap (``unirl.reward.overlap``): chunks scored on a background thread while the
caller keeps working give the same rewards, component rewards and status, bit for bit, as
``RewardService.score_track`` on the whole track; the failure policy still sees whole groups;
a batch-normalised total is refused."""

from __future__ import annotations

import time

import pytest
import torch

from unirl.config import ConfigError
from unirl.reward import RewardService, ScoreResult, WeightedRewardBackend
from unirl.reward.local import BrightnessTarget
from unirl.reward.local.geneval import ColourBlobDetector, GenEval
from unirl.types import Images, RolloutTrack


class SlowBrightness(BrightnessTarget):
    """Brightness that takes ``delay`` seconds and fails (NaN) on prompts containing 'bad'."""

    delay: float = 0.05

    def score(self, images, prompts, metadata) -> ScoreResult:
        time.sleep(self.delay)
        result = super().score(images, prompts, metadata)
        values = result.scores[self.name].clone()
        errors = [None] * len(prompts)
        for i, p in enumerate(prompts):
            if "bad" in p:
                values[i], errors[i] = float("nan"), "bad prompt"
        return ScoreResult(scores={self.name: values}, errors={self.name: errors})


def _track(n: int = 12, bad: int | None = None) -> RolloutTrack:
    gen = torch.Generator().manual_seed(0)
    pixels = torch.rand(n, 3, 16, 16, generator=gen)
    pixels[:, 0, 4:12, 4:12] = 0.95  # a red square on every image, on noise
    pixels[:, 1:, 4:12, 4:12] = 0.05
    prompts = [f"a photo of a red blob {i}" + (" bad" if i == bad else "") for i in range(n)]
    meta = [{"tag": "single_object", "include": [{"class": "red blob", "count": 1}]}] * n
    return RolloutTrack(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 4,
        prompts=prompts,
        metadata=[dict(m) for m in meta],
        decoded=Images(pixels=pixels),
    )


def _service(policy: str = "raise") -> RewardService:
    backend = WeightedRewardBackend(
        components={
            "geneval": GenEval(
                detector=ColourBlobDetector(label="{colour} blob", full_score_fraction=0.1),
                reward="clause_fraction",
            ),
            "bright": SlowBrightness(target=0.3),
        },
        weights={"geneval": 1.0, "bright": 0.5},
    )
    return RewardService(backend=backend, failure_policy=policy)


def _chunks(track: RolloutTrack, size: int):
    for start in range(0, len(track), size):
        yield track.select(torch.arange(start, min(start + size, len(track))))


@pytest.mark.parametrize(("policy", "bad"), [("raise", None), ("drop_group", 5)])
def test_overlapped_rewards_equal_end_of_rollout_bit_for_bit(policy, bad):
    track = _track(bad=bad)
    service = _service(policy)
    whole, whole_metrics = service.score_track(track)
    scorer = service.overlapped()
    for chunk in _chunks(track, 4):
        scorer.submit(chunk)
        t0 = time.perf_counter()  # "sampling" the next chunk meanwhile
        while time.perf_counter() - t0 < 0.08:
            pass
    scored, metrics = scorer.finish(track)
    assert torch.equal(scored.rewards, whole.rewards)
    assert scored.component_rewards.keys() == whole.component_rewards.keys()
    for key, value in whole.component_rewards.items():
        assert torch.equal(scored.component_rewards[key], value), key
    assert torch.equal(scored.status, whole.status)
    if bad is not None:
        assert scored.status.tolist() == [0] * 4 + [1] * 4 + [0] * 4  # the whole group dropped
    for key in ("reward/mean", "reward/std", "reward/dropped_groups", "reward/geneval/mean"):
        assert metrics[key] == whole_metrics[key], key
    assert metrics["reward_overlap/chunks"] == 3.0
    assert metrics["reward_overlap/latency_s"] >= 3 * 0.05
    assert 0.0 <= metrics["reward_overlap/hidden_fraction"] <= 1.0
    assert metrics["reward_overlap/queue_depth_max"] >= 1.0
    # the last chunk's 50 ms can hide under nothing; the first two hid under the busy loop
    assert metrics["reward_overlap/wait_s"] < metrics["reward_overlap/latency_s"]
    scorer.close()


def test_overlap_reports_queue_depth_when_scoring_falls_behind():
    track = _track()
    scorer = _service().overlapped()
    for chunk in _chunks(track, 4):
        scorer.submit(chunk)  # no work in between: the queue fills
    _, metrics = scorer.finish(track)
    assert metrics["reward_overlap/queue_depth_max"] >= 2.0
    assert metrics["reward_overlap/hidden_fraction"] < 0.9
    scorer.close()


def test_overlap_refuses_batch_normalised_totals_and_short_tracks():
    backend = WeightedRewardBackend(
        components={"a": BrightnessTarget(), "b": BrightnessTarget(target=0.2)},
        weights={"a": 1.0, "b": 1.0},
        normalize="batch_zscore",
    )
    with pytest.raises(ConfigError, match="normalize='batch_zscore'"):
        RewardService(backend=backend).overlapped()
    track = _track()
    scorer = _service().overlapped()
    scorer.submit(track.select(torch.arange(4)))
    with pytest.raises(ConfigError, match="4 samples were submitted for a track of 12"):
        scorer.finish(track)
    scorer.close()
