"""RemoteRewardBackend against a scripted stdlib HTTP stub on loopback: retries, startup
check, batching, per-sample errors, auth header, PNG encoding. (The real service is tested
in unirl-reward-service/tests.)"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from unirl.config import ConfigError
from unirl.reward import RemoteRewardBackend, RewardError, RewardService
from unirl.types import STATUS_DROPPED, STATUS_OK, Images, RolloutTrack

pytest.importorskip("httpx", reason="RemoteRewardBackend needs httpx: pip install httpx")

REWARDS = {
    "rewards": [
        {
            "name": "mean",
            "components": ["mean"],
            "has_total": False,
            "scalar": True,
            "timeout_s": 5,
        },
        {
            "name": "stats",
            "components": ["dark_fraction", "color_entropy"],
            "has_total": False,
            "scalar": False,
            "timeout_s": 5,
        },
        {
            "name": "combo",
            "components": ["a", "b"],
            "has_total": True,
            "scalar": True,
            "timeout_s": 5,
        },
    ],
    "limits": {"max_batch_size": 64},
    "auth": False,
}

Reply = tuple[int, dict, dict]  # status, json body, extra headers
Handler = Callable[[str, dict | None, dict], Reply]


def decode_mean(b64: str) -> float:
    """Mean pixel value in [0, 1] of a base64 image, as the server would see it."""
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))
    return float(pixels.astype(np.float64).mean() / 255.0)


def score_means(body: dict) -> Reply:
    """A stub /score that answers the mean pixel of each image."""
    samples = [
        {"score": decode_mean(im), "error": None, "components": {"mean": decode_mean(im)}}
        for im in body["images"]
    ]
    return 200, {"results": {body["reward"]: {"samples": samples}}}, {}


class Stub:
    """Records every request; ``handler(path, body, headers)`` decides each answer."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, str, dict | None, dict]] = []


@contextmanager
def stub_server(handler: Handler) -> Iterator[tuple[str, Stub]]:
    stub = Stub(handler)

    class Handle(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            headers = {k.lower(): v for k, v in self.headers.items()}
            stub.requests.append((method, self.path, body, headers))
            if self.path == "/rewards" and method == "GET":
                status, reply, extra = 200, REWARDS, {}
            else:
                status, reply, extra = stub.handler(self.path, body, headers)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            # The client may have timed out and left (the timeout test).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", stub
    finally:
        server.shutdown()
        server.server_close()


def posts(stub: Stub) -> list[dict]:
    return [body for method, path, body, _ in stub.requests if method == "POST"]


IMAGES = torch.tensor([0.0, 0.2, 0.4, 0.6, 1.0]).view(5, 1, 1, 1).expand(5, 3, 4, 4).contiguous()
PROMPTS = ["a", "b", "c", "d", "e"]
META = [{"i": i} for i in range(5)]


def test_retries_503_twice_then_succeeds():
    calls = []

    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            return 503, {"detail": "warming up"}, {}
        return score_means(body or {})

    with stub_server(handler) as (url, _):
        client = RemoteRewardBackend(url=url, reward="mean", max_retries=3, backoff_s=0.05)
        result = client.score(IMAGES[:2], PROMPTS[:2], META[:2])
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.05 and calls[2] - calls[1] >= 0.1  # 0.05 * 2^k backoff
    assert result.scores["mean"].tolist() == pytest.approx([0.0, 0.2], abs=1e-6)
    assert result.metrics["remote/mean/retries"] == 2.0


def test_4xx_is_not_retried_and_carries_the_server_message():
    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        return 400, {"detail": "images[0]: not valid base64"}, {}

    with stub_server(handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", max_retries=5, backoff_s=0.01)
        with pytest.raises(RewardError, match=r"answered 400: images\[0\]: not valid base64"):
            client.score(IMAGES[:1], PROMPTS[:1], META[:1])
    assert len(posts(stub)) == 1


def test_429_honours_retry_after_and_gives_up_after_max_retries():
    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        return 429, {"detail": "slow down"}, {"Retry-After": "0"}

    with stub_server(handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", max_retries=2, backoff_s=10.0)
        started = time.monotonic()
        with pytest.raises(RewardError, match=r"failed after 3 attempts; last error: HTTP 429"):
            client.score(IMAGES[:1], PROMPTS[:1], META[:1])
    assert time.monotonic() - started < 5.0  # Retry-After: 0 beat the 10 s backoff
    assert len(posts(stub)) == 3


def test_timeouts_and_refused_connections_are_retried():
    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        time.sleep(1.0)
        return score_means(body or {})

    with stub_server(handler) as (url, stub):
        client = RemoteRewardBackend(
            url=url, reward="mean", timeout_s=6.0, max_retries=1, backoff_s=0.0
        )
        client.check()
        client.timeout_s = 0.2  # tighter than the stub's 1 s answer (the check passed above)
        client.close()
        with pytest.raises(RewardError, match="failed after 2 attempts; last error: ReadTimeout"):
            client.score(IMAGES[:1], PROMPTS[:1], META[:1])
        assert len(posts(stub)) == 2

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = RemoteRewardBackend(url=f"http://127.0.0.1:{port}", reward="mean", backoff_s=0.01)
    with pytest.raises(RewardError, match=r"failed after 4 attempts; last error: ConnectError"):
        client.check()


def test_startup_check_names_what_is_missing():
    with stub_server(score_means_handler) as (url, stub):
        with pytest.raises(
            RewardError, match=r"has no reward 'ocr'; it serves \['combo', 'mean', 'stats'\]"
        ):
            RemoteRewardBackend(url=url, reward="ocr").check()
        with pytest.raises(
            RewardError,
            match=r"lacks components \['edge_density'\]; it has \['dark_fraction', 'color_entropy'\]",
        ):
            RemoteRewardBackend(url=url, reward="stats", components=["edge_density"]).check()
        with pytest.raises(RewardError, match=r"has components .* and no total"):
            RemoteRewardBackend(url=url, reward="stats").check()
        with pytest.raises(RewardError, match="has no total"):
            RemoteRewardBackend(url=url, reward="mean", use_total=True).check()
        with pytest.raises(ConfigError, match=r"timeout_s=5\.0 is not above the server's"):
            RemoteRewardBackend(url=url, reward="mean", timeout_s=5.0).check()
        info = RemoteRewardBackend(
            url=url, reward="combo", components=["a"], use_total=True
        ).check()
        assert info["name"] == "combo"
        # Scoring checks first, once.
        client = RemoteRewardBackend(url=url, reward="mean")
        client.score(IMAGES[:1], PROMPTS[:1], META[:1])
        client.score(IMAGES[:1], PROMPTS[:1], META[:1])
    gets = [path for method, path, _, _ in stub.requests if method == "GET"]
    assert gets.count("/rewards") == 7


def score_means_handler(path: str, body: dict | None, headers: dict) -> Reply:
    return score_means(body or {})


def test_batches_of_batch_size_in_order_with_png_that_round_trips():
    with stub_server(score_means_handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", batch_size=2)
        result = client.score(IMAGES, PROMPTS, META)
    bodies = posts(stub)
    assert [len(b["images"]) for b in bodies] == [2, 2, 1]
    assert [b["prompts"] for b in bodies] == [["a", "b"], ["c", "d"], ["e"]]
    assert [m for b in bodies for m in b["metadata"]] == META
    assert all(b["reward"] == "mean" for b in bodies)
    # PNG is lossless: the server sees round(255 * x) / 255 for every pixel.
    expected = (IMAGES.mul(255).round() / 255).mean(dim=(1, 2, 3))
    assert result.scores["mean"].tolist() == pytest.approx(expected.tolist(), abs=1e-7)
    assert result.errors["mean"] == [None] * 5


def test_requests_stay_within_the_server_pixel_budget(monkeypatch):
    # 4x4 images and a budget of 40 pixels per request: at most 2 images per request.
    monkeypatch.setitem(REWARDS["limits"], "max_request_pixels", 40)
    with stub_server(score_means_handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", batch_size=4)
        result = client.score(IMAGES, PROMPTS, META)
    assert [len(b["images"]) for b in posts(stub)] == [2, 2, 1]
    assert result.errors["mean"] == [None] * 5


def test_jpeg_format_sends_jpeg():
    with stub_server(score_means_handler) as (url, stub):
        RemoteRewardBackend(url=url, reward="mean", image_format="jpeg").score(
            IMAGES[:1], PROMPTS[:1], META[:1]
        )
    payload = base64.b64decode(posts(stub)[0]["images"][0])
    assert payload[:3] == b"\xff\xd8\xff"  # JPEG magic


def test_per_sample_errors_become_nan_and_reach_the_failure_policy():
    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        samples = [
            {"score": 0.5, "error": None, "components": {"mean": 0.5}},
            {
                "score": None,
                "error": "timeout after 2s",
                "components": {"mean": None},
                "component_errors": {"mean": "timeout after 2s"},
            },
            {"score": 0.7, "error": None, "components": {"mean": 0.7}},
            {"score": 0.1, "error": None, "components": {"mean": 0.1}},
        ]
        return 200, {"results": {"mean": {"samples": samples}}}, {}

    with stub_server(handler) as (url, _):
        client = RemoteRewardBackend(url=url, reward="mean")
        result = client.score(IMAGES[:4], PROMPTS[:4], META[:4])
        assert math.isnan(float(result.scores["mean"][1]))
        assert result.errors["mean"] == [None, "timeout after 2s", None, None]
        assert result.metrics["remote/mean/failed_samples"] == 1.0

        track = RolloutTrack(
            sample_ids=torch.arange(4),
            group_ids=torch.tensor([0, 0, 1, 1]),
            decoded=Images(pixels=IMAGES[:4]),
            prompts=PROMPTS[:4],
            metadata=META[:4],
        )
        with pytest.raises(RewardError, match=r"'mean' is nan for sample 1 of 4.*timeout after 2s"):
            RewardService(backend=client).score_track(track)
        scored, _ = RewardService(backend=client, failure_policy="drop_group").score_track(track)
    assert scored.status.tolist() == [STATUS_DROPPED, STATUS_DROPPED, STATUS_OK, STATUS_OK]
    assert scored.rewards.tolist() == pytest.approx([0.5, 0.0, 0.7, 0.1])


def test_components_and_total():
    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        samples = [
            {"score": 3.0, "error": None, "components": {"a": 1.0, "b": 2.0}},
            {
                "score": None,
                "error": "b: boom",
                "components": {"a": 4.0, "b": None},
                "component_errors": {"b": "boom"},
            },
        ]
        return 200, {"results": {"combo": {"samples": samples}}}, {}

    with stub_server(handler) as (url, _):
        client = RemoteRewardBackend(url=url, reward="combo", components=["a", "b"], use_total=True)
        assert client.names == ("a", "b") and client.produces_total
        result = client.score(IMAGES[:2], PROMPTS[:2], META[:2])
    assert result.scores["a"].tolist() == [1.0, 4.0]
    assert result.scores["b"][0] == 2.0 and math.isnan(float(result.scores["b"][1]))
    assert result.errors == {"a": [None, None], "b": [None, "boom"]}
    assert (
        result.total is not None and result.total[0] == 3.0 and math.isnan(float(result.total[1]))
    )


def test_wrong_result_count_raises():
    def handler(path: str, body: dict | None, headers: dict) -> Reply:
        return 200, {"results": {"mean": {"samples": []}}}, {}

    with stub_server(handler) as (url, _):
        client = RemoteRewardBackend(url=url, reward="mean")
        with pytest.raises(RewardError, match=r"expected 2 results for samples 0..1, got 0"):
            client.score(IMAGES[:2], PROMPTS[:2], META[:2])


def test_token_and_token_env(monkeypatch):
    with stub_server(score_means_handler) as (url, stub):
        RemoteRewardBackend(url=url, reward="mean", token="abc").score(
            IMAGES[:1], PROMPTS[:1], META[:1]
        )
        monkeypatch.setenv("UNIRL_TEST_REMOTE_TOKEN", "xyz")
        RemoteRewardBackend(url=url, reward="mean", token_env="UNIRL_TEST_REMOTE_TOKEN").check()
        RemoteRewardBackend(url=url, reward="mean").check()
    auths = [headers.get("authorization") for _, _, _, headers in stub.requests]
    assert auths == ["Bearer abc", "Bearer abc", "Bearer xyz", None]
    monkeypatch.delenv("UNIRL_TEST_REMOTE_TOKEN")
    with pytest.raises(ConfigError, match=r"UNIRL_TEST_REMOTE_TOKEN.*unset or empty"):
        RemoteRewardBackend(url=url, reward="mean", token_env="UNIRL_TEST_REMOTE_TOKEN").check()


def test_config_validation_and_pickling():
    with pytest.raises(ConfigError, match="must start with http"):
        RemoteRewardBackend(url="localhost:8700", reward="x")
    with pytest.raises(ConfigError, match="image_format"):
        RemoteRewardBackend(url="http://h", reward="x", image_format="webp")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        RemoteRewardBackend(url="http://h", reward="x", batch_size=0)
    with pytest.raises(ConfigError, match="token or token_env, not both"):
        RemoteRewardBackend(url="http://h", reward="x", token="a", token_env="B")
    with pytest.raises(ConfigError, match="lists a name twice"):
        RemoteRewardBackend(url="http://h", reward="x", components=["a", "a"])
    with pytest.raises(ConfigError, match="produces components"):
        RewardService(
            backend=RemoteRewardBackend(url="http://h", reward="x", components=["a", "b"])
        )
    client = RemoteRewardBackend(url="http://h/", reward="x")
    assert client.url == "http://h" and client.names == ("x",) and not client.produces_total
    with pytest.raises(RewardError, match=r"metadata\[0\] is not JSON-serialisable"):
        client.score(IMAGES[:1], ["a"], [{"t": torch.ones(1)}])
    with stub_server(score_means_handler) as (url, _):
        live = RemoteRewardBackend(url=url, reward="mean")
        live.check()
        assert live._client is not None
        clone = pickle.loads(pickle.dumps(live))
        assert clone._client is None and clone.url == url
        assert clone.score(IMAGES[:1], PROMPTS[:1], META[:1]).scores["mean"].tolist() == [0.0]


def test_hydra_instantiation_nested_in_a_weighted_backend():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    remote = {"_target_": "unirl.reward.RemoteRewardBackend", "url": "http://127.0.0.1:8700"}
    config = OmegaConf.create(
        {
            "_target_": "unirl.reward.RewardService",
            "backend": {
                "_target_": "unirl.reward.WeightedRewardBackend",
                "components": {
                    "ocr": {**remote, "reward": "ocr", "batch_size": 8},
                    "stats": {**remote, "reward": "stats", "components": ["dark_fraction"]},
                },
                "weights": {"ocr": 1.0, "stats": 0.0},
            },
        }
    )
    service = instantiate(config)
    ocr = service.backend.components["ocr"]
    assert isinstance(ocr, RemoteRewardBackend) and ocr.batch_size == 8
    assert service.backend.names == ("ocr", "stats")
    assert service.backend.components["stats"].names == ("dark_fraction",)


def test_missing_httpx_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "httpx", None)
    client = RemoteRewardBackend(url="http://127.0.0.1:9", reward="x")
    with pytest.raises(ImportError, match="RemoteRewardBackend needs httpx: pip install"):
        client.check()


# -- edits: sources travel with the images ----------------------------------------------------


def decode_pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


SOURCES = torch.tensor([0.9, 0.7, 0.5, 0.3, 0.1]).view(5, 1, 1, 1).expand(5, 3, 4, 4).contiguous()


def test_score_edit_sends_sources_beside_the_images_and_score_sends_none(monkeypatch):
    monkeypatch.setitem(REWARDS["rewards"][0], "needs_sources", True)
    with stub_server(score_means_handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", batch_size=2)
        client.score_edit(IMAGES, SOURCES, PROMPTS, META)
        client.score(IMAGES, PROMPTS, META)
    edits, plain = posts(stub)[:3], posts(stub)[3:]
    assert [len(b["sources"]) for b in edits] == [2, 2, 1]
    assert [len(b["images"]) for b in edits] == [2, 2, 1]
    sent = np.stack([decode_pixels(s) for b in edits for s in b["sources"]])
    expected = SOURCES.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(sent, expected)  # PNG: the server sees exactly round(255 * x)
    assert [len(b["images"]) for b in plain] == [2, 2, 1]
    assert all("sources" not in b for b in plain)  # the original wire format


def test_sources_use_the_image_format_and_count_in_the_pixel_budget(monkeypatch):
    monkeypatch.setitem(REWARDS["rewards"][0], "needs_sources", False)
    # 4x4 results + 4x4 sources = 32 pixels a sample; a budget of 40 sends one per request
    monkeypatch.setitem(REWARDS["limits"], "max_request_pixels", 40)
    with stub_server(score_means_handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", batch_size=4, image_format="jpeg")
        result = client.score_edit(IMAGES[:3], SOURCES[:3], PROMPTS[:3], META[:3])
    bodies = posts(stub)
    assert [len(b["sources"]) for b in bodies] == [1, 1, 1]
    assert all(base64.b64decode(b["sources"][0])[:3] == b"\xff\xd8\xff" for b in bodies)
    assert result.errors["mean"] == [None] * 3


def test_score_edit_refuses_a_server_without_edit_support_before_posting():
    with stub_server(score_means_handler) as (url, stub):  # its /rewards has no needs_sources
        client = RemoteRewardBackend(url=url, reward="mean")
        with pytest.raises(RewardError, match=r"predates edit requests.*upgrade"):
            client.score_edit(IMAGES[:2], SOURCES[:2], PROMPTS[:2], META[:2])
        with pytest.raises(RewardError, match=r"\(sources\) expects images of shape \[N=2"):
            client.score_edit(IMAGES[:2], SOURCES[:1], PROMPTS[:2], META[:2])
    assert posts(stub) == []


def test_reward_service_sends_the_track_references(monkeypatch):
    monkeypatch.setitem(REWARDS["rewards"][0], "needs_sources", True)
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.tensor([0, 0]),
        decoded=Images(pixels=IMAGES[:2]),
        prompts=PROMPTS[:2],
        metadata=META[:2],
        references=Images(pixels=SOURCES[:2]),
    )
    with stub_server(score_means_handler) as (url, stub):
        RewardService(backend=RemoteRewardBackend(url=url, reward="mean")).score_track(track)
    (body,) = posts(stub)
    assert [decode_pixels(s)[0, 0, 0] for s in body["sources"]] == [230, 178]  # 0.9, 0.7


# -- videos: each goes as its frames, with fps ---------------------------------------------------


def score_video_means_handler(path: str, body: dict | None, headers: dict) -> Reply:
    """A stub /score for videos: each video's mean pixel over all of its frames."""
    body = body or {}
    means = [float(np.mean([decode_mean(f) for f in video])) for video in body["videos"]]
    samples = [{"score": m, "error": None, "components": {"mean": m}} for m in means]
    return 200, {"results": {body["reward"]: {"samples": samples}}}, {}


# 5 videos of 3 frames: video i, frame t has every pixel at (i + t) / 10
VIDEOS = (
    (torch.arange(5).view(5, 1) + torch.arange(3).view(1, 3)).float().div(10).view(5, 3, 1, 1, 1)
).expand(5, 3, 3, 4, 4)


def test_score_video_sends_frames_and_fps(monkeypatch):
    monkeypatch.setitem(REWARDS["rewards"][0], "scores_videos", True)
    with stub_server(score_video_means_handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", batch_size=2)
        result = client.score_video(VIDEOS, 16.0, PROMPTS, META)
    bodies = posts(stub)
    assert [len(b["videos"]) for b in bodies] == [2, 2, 1]
    assert all(len(v) == 3 for b in bodies for v in b["videos"])
    assert all(b["fps"] == 16.0 and "images" not in b for b in bodies)
    assert [b["prompts"] for b in bodies] == [["a", "b"], ["c", "d"], ["e"]]
    sent = np.stack([np.stack([decode_pixels(f) for f in v]) for b in bodies for v in b["videos"]])
    expected = VIDEOS.mul(255).round().to(torch.uint8).permute(0, 1, 3, 4, 2).numpy()
    assert np.array_equal(sent, expected)  # PNG: every frame exactly round(255 * x), in order
    means = (VIDEOS.mul(255).round() / 255).mean(dim=(1, 2, 3, 4))
    assert result.scores["mean"].tolist() == pytest.approx(means.tolist(), abs=1e-7)
    assert result.errors["mean"] == [None] * 5


def test_video_pixel_budget_counts_every_frame(monkeypatch):
    monkeypatch.setitem(REWARDS["rewards"][0], "scores_videos", True)
    # 3 frames of 4x4 = 48 pixels a video; a budget of 100 sends two videos per request
    monkeypatch.setitem(REWARDS["limits"], "max_request_pixels", 100)
    with stub_server(score_video_means_handler) as (url, stub):
        client = RemoteRewardBackend(url=url, reward="mean", batch_size=4)
        client.score_video(VIDEOS, 8.0, PROMPTS, META)
    assert [len(b["videos"]) for b in posts(stub)] == [2, 2, 1]


def test_score_video_refusals_before_posting(monkeypatch):
    with stub_server(score_video_means_handler) as (url, stub):  # /rewards: no scores_videos
        client = RemoteRewardBackend(url=url, reward="mean")
        with pytest.raises(RewardError, match=r"predates whole-video requests.*upgrade"):
            client.score_video(VIDEOS[:2], 16.0, PROMPTS[:2], META[:2])
        monkeypatch.setitem(REWARDS["rewards"][0], "scores_videos", False)
        client = RemoteRewardBackend(url=url, reward="mean")
        with pytest.raises(RewardError, match=r"scores images, not videos.*PerFrame"):
            client.score_video(VIDEOS[:2], 16.0, PROMPTS[:2], META[:2])
        monkeypatch.setitem(REWARDS["rewards"][0], "scores_videos", True)
        monkeypatch.setitem(REWARDS["limits"], "max_frames", 2)
        client = RemoteRewardBackend(url=url, reward="mean")
        with pytest.raises(RewardError, match=r"videos of 3 frames.*at most 2"):
            client.score_video(VIDEOS[:2], 16.0, PROMPTS[:2], META[:2])
        with pytest.raises(RewardError, match=r"expects videos of shape \[N=2, T, 3, H, W\]"):
            client.score_video(IMAGES[:2], 16.0, PROMPTS[:2], META[:2])
        with pytest.raises(RewardError, match=r"fps=0.0; give the videos' frames per second"):
            client.score_video(VIDEOS[:2], 0.0, PROMPTS[:2], META[:2])
    assert posts(stub) == []


def test_credentials_in_the_url_send_basic_auth_and_never_appear_in_messages():
    """``http://user:password@host``: basic auth reaches the server; the password is in no
    error message or repr, and a bearer token beside it is refused (httpx would silently
    replace the token's header with the URL's basic auth)."""
    with stub_server(score_means_handler) as (url, stub):
        secret_url = url.replace("http://", "http://alice:pa%2055word@")
        backend = RemoteRewardBackend(url=secret_url, reward="mean")
        assert backend.url == url
        backend.score(IMAGES[:1], PROMPTS[:1], META[:1])
        sent = {headers.get("authorization") for _, _, _, headers in stub.requests}
        assert sent == {"Basic " + base64.b64encode(b"alice:pa 55word").decode()}
        assert "55word" not in repr(backend) and "alice" not in repr(backend)
        assert "s3cr3t" not in repr(RemoteRewardBackend(url=url, reward="mean", token="s3cr3t"))
        with pytest.raises(ConfigError, match=r"basic auth.*a token is set too"):
            RemoteRewardBackend(url=secret_url, reward="mean", token="abc")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = RemoteRewardBackend(
        url=f"http://alice:pa55word@127.0.0.1:{port}", reward="mean", max_retries=0
    )
    with pytest.raises(RewardError) as err:
        down.check()
    assert f"http://127.0.0.1:{port}/rewards" in str(err.value)
    assert "pa55word" not in str(err.value)
