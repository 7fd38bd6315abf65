"""A timed-out scorer is cancelled, not left running: through the real HTTP server, a scorer
that works in small steps and writes each step to a file stops writing right after its
request's timeout, its thread exits, and the service keeps answering. Jobs of another
request that shared the cancelled call are scored again, not lost."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from torch import Tensor
from unirl.reward import RewardBackend, ScoreResult

from unirl_reward_service import create_app
from unirl_reward_service.codec import encode_png
from unirl_reward_service.config import RewardConfig
from unirl_reward_service.pool import RewardPool, Sample
from unirl_reward_service.testing import serve_in_thread

TOKEN = "cancel-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 0.5
STEP_S = 0.02  # one step of the slow scorer: one short native call (a sleep), then a write


@dataclass(kw_only=True)
class Stepping(RewardBackend):
    """Mean pixel value, after ``metadata["steps"]`` steps of ``STEP_S`` each, every step
    appended to the file ``metadata["progress"]`` (its work, visible from outside)."""

    @property
    def names(self) -> tuple[str, ...]:
        return ("stepping",)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        assert images is not None
        for meta in metadata:
            progress = meta.get("progress")
            for step in range(int(meta.get("steps", 0))):
                time.sleep(STEP_S)
                if progress:
                    with open(progress, "a") as f:
                        f.write(f"{step}\n")
        return ScoreResult(scores={"stepping": images.mean(dim=(1, 2, 3))})


def _target(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _replica_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"reward-{name}-")]


def _wait(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def png(level: int) -> str:
    return encode_png(torch.full((8, 8, 3), level, dtype=torch.uint8).numpy())


def test_a_timed_out_scorer_stops_working_and_the_service_keeps_serving(tmp_path: Path) -> None:
    config = {
        "server": {"auth_token": TOKEN, "batch_wait_ms": 1},
        "rewards": {"stepping": {"_target_": _target(Stepping), "timeout_s": TIMEOUT_S}},
    }
    progress = tmp_path / "progress.txt"
    steps = 250  # 5 s of work if nobody stops it, 10x the timeout
    with serve_in_thread(create_app(config)) as url:
        started = time.monotonic()
        answer = httpx.post(
            url + "/score",
            json={
                "reward": "stepping",
                "images": [png(51)],
                "metadata": [{"steps": steps, "progress": str(progress)}],
            },
            headers=AUTH,
            timeout=30,
        )
        elapsed = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        sample = answer.json()["results"]["stepping"]["samples"][0]
        assert sample["error"] == f"timeout after {TIMEOUT_S:g}s" and sample["score"] is None
        assert elapsed < TIMEOUT_S + 1.0

        # the cancelled thread exits within a step or two; only the replacement is left
        assert _wait(lambda: len(_replica_threads("stepping")) == 1, 2.0), [
            t.name for t in _replica_threads("stepping")
        ]
        health = httpx.get(url + "/health", headers=AUTH).json()
        assert health["status"] == "ok"
        assert health["rewards"]["stepping"]["abandoned"] == 0
        assert health["rewards"]["stepping"]["replicas"] == 1

        # its work is gone: the progress file stops growing, well short of the full count
        done = _lines(progress)
        time.sleep(0.5)  # 25 steps' time
        assert _lines(progress) == done
        assert 0 < done <= (TIMEOUT_S + 0.5) / STEP_S < steps

        # the service keeps serving: the replacement scores the next request exactly
        fast = httpx.post(
            url + "/score",
            json={"reward": "stepping", "images": [png(51)], "metadata": [{"steps": 1}]},
            headers=AUTH,
            timeout=30,
        )
        assert fast.status_code == 200
        assert fast.json()["results"]["stepping"]["samples"][0]["score"] == pytest.approx(0.2)


def test_a_job_that_shared_the_cancelled_call_is_scored_again() -> None:
    """Two requests batched into one call: the first gives up and the call is cancelled; the
    second's samples go back to the queue and the replacement scores them."""
    config = RewardConfig(
        name="stepping",
        scorer={"_target_": _target(Stepping)},
        replicas=1,
        timeout_s=TIMEOUT_S,
        max_batch_size=4,
    )
    pool = RewardPool(config, batch_wait_s=0.2)  # long enough to batch both submits
    try:
        pixels = torch.full((3, 4, 4), 51, dtype=torch.uint8)
        slow = pool.submit([Sample(pixels, "", {"steps": 250})])
        other = pool.submit([Sample(pixels, "", {"steps": 0})])
        time.sleep(0.4)  # both taken into one call, which is now stepping
        assert pool.state()["busy"] == 1 and pool.state()["queued_jobs"] == 0
        pool.expire(slow, timed_out_samples=1)
        result = other[0].result(timeout=5)  # scored by the replacement, not lost
        assert result[0].components["stepping"] == pytest.approx(0.2)
        with pytest.raises(TimeoutError):
            slow[0].result(timeout=5)
        assert _wait(lambda: pool.state()["abandoned"] == 0, 2.0)
        assert len(_replica_threads("stepping")) == 1
    finally:
        pool.close()
