"""Worker pools: batching across requests, per-sample isolation, chunking, shutdown."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor
from unirl.reward import RewardBackend, ScoreResult

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


def test_closed_pool_cancels_queued_work_and_refuses_new():
    pool = make_pool(max_batch_size=2, batch_wait_ms=0)
    pool.close()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit([sample(1)])
