"""Worker pools: batching across requests, per-sample isolation, chunking, shutdown."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor
from unirl.reward import EditRewardBackend, RewardBackend, ScoreResult

from unirl_reward_service.config import RewardConfig
from unirl_reward_service.pool import RewardPool, Sample, score_samples


@dataclass(kw_only=True)
class Recording(RewardBackend):
    """Scores the first pixel's red value (0..255); records each call's batch size."""

    calls: ClassVar[list[int]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()
    fail_on: int = -1

    @property
    def names(self) -> tuple[str, ...]:
        return ("red",)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        assert images is not None
        with self.lock:
            type(self).calls.append(images.shape[0])
        red = (images[:, 0, 0, 0] * 255).round()
        if bool((red == self.fail_on).any()):
            raise RuntimeError(f"bad pixel {self.fail_on}")
        return ScoreResult(scores={"red": red})


def sample(red: int, size: int = 4) -> Sample:
    pixels = torch.zeros(3, size, size, dtype=torch.uint8)
    pixels[0] = red
    return Sample(pixels=pixels, prompt="", metadata={})


def make_pool(max_batch_size: int, batch_wait_ms: float, **scorer) -> RewardPool:
    target = f"{Recording.__module__}.Recording"
    config = RewardConfig(
        name="rec",
        scorer={"_target_": target, **scorer},
        replicas=1,
        max_batch_size=max_batch_size,
    )
    Recording.calls = []
    return RewardPool(config, batch_wait_ms / 1000.0)


def test_concurrent_requests_share_one_scorer_call():
    pool = make_pool(max_batch_size=6, batch_wait_ms=200)
    try:
        futures = [pool.submit([sample(10 * r + i) for i in range(2)])[0] for r in range(4)]
        results = [f.result(timeout=10) for f in futures]
    finally:
        pool.close()
    # Three 2-sample requests fill the 6-sample batch; the fourth no longer fits.
    assert Recording.calls == [6, 2]
    for r, result in enumerate(results):
        assert [x.components["red"] for x in result] == [10.0 * r, 10.0 * r + 1]
        assert all(x.errors == {} for x in result)
    assert pool.state()["batches"] == 2
    assert pool.state()["scored_samples"] == 8


def test_large_requests_are_chunked_to_max_batch_size():
    pool = make_pool(max_batch_size=3, batch_wait_ms=0)
    try:
        futures = pool.submit([sample(i) for i in range(7)])
        values = [x.components["red"] for f in futures for x in f.result(timeout=10)]
    finally:
        pool.close()
    assert len(futures) == 3
    assert values == [float(i) for i in range(7)]
    assert sorted(Recording.calls) == [1, 3, 3]


def test_a_failing_sample_fails_only_itself():
    scorer = Recording(fail_on=7)
    Recording.calls = []
    samples = [sample(5), sample(7), sample(9), sample(11, size=6)]
    results = score_samples(scorer, samples, has_total=False, source="test")
    assert [results[i].components["red"] for i in (0, 2, 3)] == [5.0, 9.0, 11.0]
    assert math.isnan(results[1].components["red"])
    assert results[1].errors == {"red": "RuntimeError: bad pixel 7"}
    assert [r.errors for r in results if r is not results[1]] == [{}, {}, {}]
    # One call per image size (3 of 4x4, 1 of 6x6); the failed 4x4 call is redone per sample.
    assert Recording.calls == [3, 1, 1, 1, 1]


@dataclass(kw_only=True)
class RedDifference(EditRewardBackend):
    """An edit reward: result red minus source red (0..255) at the first pixel; records the
    (images, sources) shapes of each call."""

    calls: ClassVar[list[tuple[tuple[int, ...], tuple[int, ...]]]] = []

    @property
    def names(self) -> tuple[str, ...]:
        return ("diff",)

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        type(self).calls.append((tuple(images.shape), tuple(sources.shape)))
        diff = (images[:, 0, 0, 0] - sources[:, 0, 0, 0]).mul(255).round()
        return ScoreResult(scores={"diff": diff})


def edit(red: int, source_red: int | None, source_size: int = 4) -> Sample:
    item = sample(red)
    if source_red is not None:
        item.source = sample(source_red, size=source_size).pixels
    return item


def test_edits_group_by_source_size_and_samples_without_sources_fail_alone():
    RedDifference.calls = []
    samples = [edit(50, 20), edit(60, None), edit(70, 30, source_size=6), edit(80, 5)]
    results = score_samples(RedDifference(), samples, has_total=False, source="reward 'd' (x)")
    assert [results[i].components["diff"] for i in (0, 2, 3)] == [30.0, 40.0, 75.0]
    assert math.isnan(results[1].components["diff"])
    assert (
        "reward 'd' (x) compares each image with the image it was edited from"
        in (results[1].errors["diff"])
    )
    # one call per (image size, source size); the sample without a source is never passed on
    assert sorted(RedDifference.calls) == [
        ((1, 3, 4, 4), (1, 3, 6, 6)),
        ((2, 3, 4, 4), (2, 3, 4, 4)),
    ]
    # a scorer of the result alone scores an edit's image and ignores its source
    Recording.calls = []
    plain = score_samples(Recording(), samples, has_total=False, source="test")
    assert [r.components["red"] for r in plain] == [50.0, 60.0, 70.0, 80.0]


def test_closed_pool_cancels_queued_work_and_refuses_new():
    pool = make_pool(max_batch_size=2, batch_wait_ms=0)
    pool.close()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit([sample(1)])
