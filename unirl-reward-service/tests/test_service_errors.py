"""Client mistakes get documented 4xx answers, scorer failures and timeouts get per-sample
errors, and after each the server answers the next good request."""

from __future__ import annotations

import base64
import io
import math
import time
from dataclasses import dataclass

import httpx
import pytest
import torch
from PIL import Image
from torch import Tensor
from unirl.reward import RemoteRewardBackend, RewardBackend, RewardError, RewardService, ScoreResult
from unirl.types import STATUS_DROPPED, STATUS_OK, Images, RolloutTrack

from unirl_reward_service import create_app
from unirl_reward_service.codec import encode_png
from unirl_reward_service.testing import serve_in_thread

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass(kw_only=True)
class FlakyMean(RewardBackend):
    """Mean pixel value; raises for a batch holding a sample with ``metadata["fail"]`` and
    returns NaN for ``metadata["nan"]``."""

    name: str = "flaky"

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        assert images is not None
        failing = [i for i, m in enumerate(metadata) if m.get("fail")]
        if failing:
            raise ValueError(f"flaky scorer refuses samples {failing} of this batch")
        values = images.mean(dim=(1, 2, 3))
        for i, meta in enumerate(metadata):
            if meta.get("nan"):
                values[i] = math.nan
        return ScoreResult(scores={self.name: values})


@dataclass(kw_only=True)
class SlowMean(FlakyMean):
    """Sleeps ``max(metadata["sleep"])`` seconds, then scores like :class:`FlakyMean`."""

    name: str = "slow"

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        time.sleep(max(float(m.get("sleep", 0.0)) for m in metadata))
        return super().score(images, prompts, metadata)


MAX_BYTES = 150_000
SLOW_TIMEOUT_S = 0.4
SLEEP_S = 2.0


def _target(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.fixture(scope="module")
def service():
    config = {
        "server": {
            "auth_token": TOKEN,
            "max_request_bytes": MAX_BYTES,
            "max_batch_size": 8,
            "max_image_pixels": 64 * 64,
            "batch_wait_ms": 1,
        },
        "rewards": {
            "flaky": {"_target_": _target(FlakyMean), "max_batch_size": 8},
            "jpeg": {"_target_": "unirl.reward.local.JpegCompressibility"},
            "slow": {"_target_": _target(SlowMean), "timeout_s": SLOW_TIMEOUT_S},
        },
    }
    with serve_in_thread(create_app(config)) as url:
        yield url


def png(level: int, size: int = 16) -> str:
    return encode_png(torch.full((size, size, 3), level, dtype=torch.uint8).numpy())


def post(url: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url + "/score", json=body, headers=AUTH if headers is None else headers)


def assert_serving(url: str) -> None:
    """A good request right after a bad one succeeds with the exact expected score."""
    answer = post(url, {"reward": "flaky", "images": [png(51)]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"]["flaky"]["samples"][0] == {
        "score": pytest.approx(0.2),
        "error": None,
        "components": {"flaky": pytest.approx(0.2)},
        "component_errors": {},
    }


def test_missing_or_wrong_token_is_401(service):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
        answer = post(service, {"reward": "flaky", "images": [png(1)]}, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in answer.json()["detail"]
    assert httpx.get(service + "/rewards").status_code == 401
    assert httpx.get(service + "/rewards", headers=AUTH).status_code == 200
    health = httpx.get(service + "/health")  # liveness stays open, without reward names
    assert health.status_code == 200 and health.json()["rewards"] is None
    assert_serving(service)


def test_client_sends_the_token(service, monkeypatch):
    images = torch.full((2, 3, 8, 8), 0.2)
    no_token = RemoteRewardBackend(url=service, reward="flaky")
    with pytest.raises(RewardError, match="answered 401: missing or wrong bearer token"):
        no_token.check()
    monkeypatch.setenv("UNIRL_TEST_TOKEN", TOKEN)
    client = RemoteRewardBackend(url=service, reward="flaky", token_env="UNIRL_TEST_TOKEN")
    result = client.score(images, ["", ""], [{}, {}])
    torch.testing.assert_close(result.scores["flaky"], torch.full((2,), 0.2), rtol=0, atol=1e-6)


def test_malformed_base64_and_undecodable_images_are_422_naming_the_index(service):
    gif = io.BytesIO()
    Image.new("RGB", (4, 4)).save(gif, format="GIF")
    cases = {
        "images[1]: not valid base64": [png(1), "%%%not-base64%%%"],
        "images[2]: not a decodable PNG or JPEG image": [
            png(1),
            png(2),
            base64.b64encode(b"plain text, not an image").decode(),
        ],
        "images[0]: GIF image; send PNG or JPEG": [base64.b64encode(gif.getvalue()).decode()],
        "images[0]: empty payload": [""],
        "images[0]: not a decodable PNG or JPEG image": [
            base64.b64encode(base64.b64decode(png(3))[:40]).decode()  # truncated PNG
        ],
    }
    for message, images in cases.items():
        answer = post(service, {"reward": "flaky", "images": images})
        assert answer.status_code == 422, (message, answer.text)
        assert answer.json()["detail"].startswith(message), answer.json()
        assert_serving(service)


def test_malformed_bodies_are_422(service):
    bodies = [
        {"reward": "flaky"},  # no images
        {"reward": "flaky", "rewards": ["jpeg"], "images": [png(1)]},  # both
        {"images": [png(1)]},  # no reward
        {"reward": "flaky", "images": [png(1)], "prompts": ["a", "b"]},  # length mismatch
        {"reward": "flaky", "images": [png(1)], "videos": [[png(1)]]},
        {"reward": "flaky", "images": [png(1)], "unknown_key": 1},
        {"rewards": ["flaky", "flaky"], "images": [png(1)]},
        {"reward": "flaky", "images": []},
    ]
    for body in bodies:
        answer = post(service, body)
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["detail"]
    headers = {**AUTH, "Content-Type": "application/json"}
    answer = httpx.post(service + "/score", content=b"{not json", headers=headers)
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["type"] == "json_invalid"
    answer = httpx.post(service + "/score", content=b"{not json", headers=AUTH)  # no JSON type
    assert answer.status_code == 422
    assert_serving(service)


def test_unknown_reward_is_404_naming_the_known_ones(service):
    answer = post(service, {"rewards": ["flaky", "aesthetic"], "images": [png(1)]})
    assert answer.status_code == 404
    assert answer.json()["detail"] == (
        "unknown reward ['aesthetic']; this server has ['flaky', 'jpeg', 'slow'] (GET /rewards)"
    )
    assert_serving(service)


def test_oversized_requests_are_413(service):
    big = base64.b64encode(bytes(MAX_BYTES)).decode()
    answer = post(service, {"reward": "flaky", "images": [big]})  # Content-Length check
    assert answer.status_code == 413
    assert "exceeds server.max_request_bytes=150000" in answer.json()["detail"]
    assert_serving(service)

    def chunks():  # no Content-Length: the received body is counted
        yield b'{"reward": "flaky", "images": ["'
        for _ in range(20):
            yield b"A" * 10_000
        yield b'"]}'

    answer = httpx.post(service + "/score", content=chunks(), headers=AUTH)
    assert answer.status_code == 413
    assert "exceeds server.max_request_bytes" in answer.json()["detail"]
    assert_serving(service)

    answer = post(service, {"reward": "flaky", "images": [png(1, size=4)] * 9})
    assert answer.status_code == 413
    assert answer.json()["detail"] == (
        "9 images in one request; this server accepts at most 8 (server.max_batch_size): "
        "split the batch"
    )
    answer = post(service, {"reward": "flaky", "images": [png(1), png(1, size=65)]})
    assert answer.status_code == 413
    assert answer.json()["detail"].startswith("images[1]: 65x65 image has 4225 pixels")
    assert_serving(service)


def test_raising_scorer_fails_only_its_own_samples_and_reward(service):
    body = {
        "rewards": ["flaky", "jpeg"],
        "images": [png(51), png(102), png(153)],
        "metadata": [{}, {"fail": True}, {"nan": True}],
    }
    answer = post(service, body)
    assert answer.status_code == 200, answer.text
    flaky = answer.json()["results"]["flaky"]
    scores = [s["score"] for s in flaky["samples"]]
    errors = [s["error"] for s in flaky["samples"]]
    # The batch raised, so each sample was scored alone: only sample 1 fails.
    assert scores == [pytest.approx(0.2), None, None]
    assert errors == [
        None,
        "ValueError: flaky scorer refuses samples [0] of this batch",
        "non-finite score (nan)",
    ]
    assert flaky["metrics"] == {"failures": 2.0, "timeouts": 0.0, "flaky/failures": 2.0}
    jpeg = answer.json()["results"]["jpeg"]
    assert all(s["error"] is None and s["score"] < 0 for s in jpeg["samples"])
    assert_serving(service)


def test_per_sample_errors_reach_the_failure_policy(service):
    images = torch.full((4, 3, 8, 8), 0.2)
    metadata = [{}, {"fail": True}, {}, {}]
    client = RemoteRewardBackend(url=service, reward="flaky", token=TOKEN)
    result = client.score(images, ["a", "b", "c", "d"], metadata)
    assert math.isnan(float(result.scores["flaky"][1]))
    assert result.errors["flaky"][1] == "ValueError: flaky scorer refuses samples [0] of this batch"
    assert result.metrics["remote/flaky/failed_samples"] == 1.0

    track = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        decoded=Images(pixels=images),
        prompts=["a", "b", "c", "d"],
        metadata=metadata,
    )
    with pytest.raises(RewardError, match=r"'flaky' is nan for sample 1 of 4.*refuses samples"):
        RewardService(backend=client).score_track(track)
    scored, metrics = RewardService(backend=client, failure_policy="drop_group").score_track(track)
    assert scored.status.tolist() == [STATUS_DROPPED, STATUS_DROPPED, STATUS_OK, STATUS_OK]
    assert metrics["reward/dropped_groups"] == 1.0


def test_slow_scorer_times_out_per_sample_and_the_server_recovers(service):
    started = time.monotonic()
    answer = post(
        service,
        {
            "rewards": ["slow", "flaky"],
            "images": [png(51), png(51)],
            "metadata": [{"sleep": SLEEP_S}, {}],
        },
    )
    elapsed = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    slow = answer.json()["results"]["slow"]
    assert [s["error"] for s in slow["samples"]] == [f"timeout after {SLOW_TIMEOUT_S:g}s"] * 2
    assert [s["score"] for s in slow["samples"]] == [None, None]
    assert slow["metrics"]["timeouts"] == 2.0
    assert elapsed < SLEEP_S - 0.5  # the answer did not wait for the stuck call
    flaky = answer.json()["results"]["flaky"]
    assert [s["score"] for s in flaky["samples"]] == [pytest.approx(0.2)] * 2

    health = httpx.get(service + "/health", headers=AUTH).json()
    assert health["status"] == "degraded"
    assert health["rewards"]["slow"]["abandoned"] == 1
    assert health["rewards"]["slow"]["timeouts"] == 2

    # The stuck replica was replaced: the same reward answers a fast request right away.
    fast = post(service, {"reward": "slow", "images": [png(51)], "metadata": [{"sleep": 0}]})
    assert fast.json()["results"]["slow"]["samples"][0]["score"] == pytest.approx(0.2)
    assert_serving(service)

    deadline = time.monotonic() + SLEEP_S + 5
    while time.monotonic() < deadline:
        health = httpx.get(service + "/health", headers=AUTH).json()
        if health["status"] == "ok":
            break
        time.sleep(0.1)
    assert health["status"] == "ok"
    assert health["rewards"]["slow"]["abandoned"] == 0
    assert health["rewards"]["slow"]["replicas"] == 1
