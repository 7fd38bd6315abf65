"""The service on loopback gives the same scores as the in-process scorers.

Tolerance: exact (``torch.equal``) for images sent as PNG: ``uint8`` pixels survive the PNG
round trip bit for bit, the server divides by 255 exactly as the test does, and each request
is one scorer call with the same batch. JPEG payloads are compared with the in-process score
of the JPEG-decoded pixels (also exact). Videos reach the reward's ``score_video`` whole,
as ``frames[n, T, 3, H, W]``: exact for PNG frames; an mp4's decoded frames, exact too.
"""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont
from unirl.reward import RemoteRewardBackend, RewardError, RewardService, WeightedRewardBackend
from unirl.reward.local import (
    BrightnessTarget,
    ImageStats,
    JpegCompressibility,
    JpegIncompressibility,
    OCRScorer,
    PerFrame,
    RegionColorTarget,
    SourcePreservation,
    TemporalConsistency,
)
from unirl.types import Images, RolloutTrack, Videos

from unirl_reward_service import create_app
from unirl_reward_service.codec import encode_png
from unirl_reward_service.testing import serve_in_thread

STATS = ("dark_fraction", "color_entropy", "edge_density")
CONFIG = {
    "server": {"batch_wait_ms": 2, "require_auth": False},
    "rewards": {
        "jpeg": {"_target_": "unirl.reward.local.JpegCompressibility", "replicas": 2},
        "jpeg_incompressibility": {"_target_": "unirl.reward.local.JpegIncompressibility"},
        "stats": {"_target_": "unirl.reward.local.ImageStats", "max_batch_size": 64},
        "brightness": {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.5},
        "task_and_guard": {
            "_target_": "unirl.reward.WeightedRewardBackend",
            "components": {
                "bright": {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.5},
                "jpeg": {"_target_": "unirl.reward.local.JpegCompressibility"},
            },
            "weights": {"bright": 2.0, "jpeg": 0.25},
        },
        "preserve": {"_target_": "unirl.reward.local.SourcePreservation"},
        "bright_frames": {
            "_target_": "unirl.reward.local.PerFrame",
            "scorer": {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.5},
        },
        "temporal": {"_target_": "unirl.reward.local.TemporalConsistency"},
        "video_combo": {
            "_target_": "unirl.reward.WeightedRewardBackend",
            "components": {
                "bright": {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.5},
                "temporal": {"_target_": "unirl.reward.local.TemporalConsistency"},
            },
            "weights": {"bright": 1.0, "temporal": 0.5},
        },
        "edit_combo": {
            "_target_": "unirl.reward.WeightedRewardBackend",
            "components": {
                "preserve": {"_target_": "unirl.reward.local.SourcePreservation"},
                "region": {"_target_": "unirl.reward.local.RegionColorTarget", "relative": True},
                "jpeg": {"_target_": "unirl.reward.local.JpegCompressibility"},
            },
            "weights": {"preserve": 1.0, "region": 2.0, "jpeg": 0.0},
        },
    },
}


def uint8_images(n: int, h: int = 24, w: int = 32, seed: int = 0) -> torch.Tensor:
    """Random ``uint8`` pixels as ``[n, 3, h, w]`` float32 = k / 255 (what the server sees)."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8)
    # Smooth half of each image so JPEG sizes and edge densities vary across samples.
    pixels[:, :, : h // 2] = (
        pixels[:, :, : h // 2].float().mean(dim=3, keepdim=True).to(torch.uint8)
    )
    return pixels.float() / 255.0


def as_png(image: torch.Tensor) -> str:
    array = image.mul(255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return encode_png(array)


@pytest.fixture(scope="module")
def service():
    app = create_app(CONFIG)
    with serve_in_thread(app) as url:
        yield url


def test_remote_scores_equal_in_process(service):
    images = uint8_images(6)
    prompts = [f"p{i}" for i in range(6)]
    metadata = [{} for _ in range(6)]
    jpeg = RemoteRewardBackend(url=service, reward="jpeg", batch_size=6)
    local = JpegCompressibility().score(images, prompts, metadata).scores["jpeg_compressibility"]
    remote = jpeg.score(images, prompts, metadata)
    assert torch.equal(remote.scores["jpeg"], local)
    assert remote.errors["jpeg"] == [None] * 6
    assert remote.metrics == {"remote/jpeg/retries": 0.0, "remote/jpeg/failed_samples": 0.0}

    incompressible = RemoteRewardBackend(url=service, reward="jpeg_incompressibility")
    local_inc = JpegIncompressibility().score(images, prompts, metadata)
    assert torch.equal(
        incompressible.score(images, prompts, metadata).scores["jpeg_incompressibility"],
        local_inc.scores["jpeg_incompressibility"],
    )

    stats = RemoteRewardBackend(url=service, reward="stats", components=STATS)
    local_stats = ImageStats().score(images, prompts, metadata)
    remote_stats = stats.score(images, prompts, metadata)
    for name in STATS:
        assert torch.equal(remote_stats.scores[name], local_stats.scores[name]), name


def test_batches_split_on_the_client_and_keep_order(service):
    images = uint8_images(5, seed=1)
    metadata = [{} for _ in range(5)]
    client = RemoteRewardBackend(url=service, reward="brightness", batch_size=2)
    remote = client.score(images, [""] * 5, metadata)
    expected = BrightnessTarget(target=0.5).score(images, [""] * 5, metadata).scores["brightness"]
    # 3 requests of 2, 2, 1 images: each is its own scorer call, so per-sample equality is
    # exact only up to float32 reduction order across batch shapes.
    torch.testing.assert_close(remote.scores["brightness"], expected, rtol=0, atol=1e-6)


def test_jpeg_payloads_score_the_decoded_pixels(service):
    images = uint8_images(3, seed=2)
    client = RemoteRewardBackend(url=service, reward="stats", components=STATS, image_format="jpeg")
    remote = client.score(images, [""] * 3, [{}] * 3)
    decoded = []
    for array in images.mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy():
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=95)
        pixels = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
        decoded.append(torch.from_numpy(pixels.copy()).permute(2, 0, 1))
    local = ImageStats().score(torch.stack(decoded).float() / 255.0, [""] * 3, [{}] * 3)
    for name in STATS:
        assert torch.equal(remote.scores[name], local.scores[name]), name


def test_weighted_remote_reward_feeds_reward_service(service):
    images = uint8_images(4, seed=3)
    prompts = ["a", "b", "c", "d"]
    local = WeightedRewardBackend(
        components={"bright": BrightnessTarget(target=0.5), "jpeg": JpegCompressibility()},
        weights={"bright": 2.0, "jpeg": 0.25},
    ).score(images, prompts, [{}] * 4)
    client = RemoteRewardBackend(
        url=service, reward="task_and_guard", components=["bright", "jpeg"], use_total=True
    )
    reward_service = RewardService(backend=client)
    track = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        decoded=Images(pixels=images),
        prompts=prompts,
    )
    scored, metrics = reward_service.score_track(track)
    assert torch.equal(scored.rewards, local.total)
    assert torch.equal(scored.component_rewards["jpeg"], local.scores["jpeg"])
    assert torch.equal(scored.component_rewards["bright"], local.scores["bright"])
    assert metrics["reward/dropped_groups"] == 0.0


def test_one_request_several_rewards(service):
    images = uint8_images(2, seed=4)
    body = {"rewards": ["jpeg", "stats"], "images": [as_png(im) for im in images]}
    answer = httpx.post(service + "/score", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["kind"] == "images" and data["num_samples"] == 2
    assert set(data["results"]) == {"jpeg", "stats"}
    stats = data["results"]["stats"]
    assert stats["components"] == list(STATS) and stats["has_total"] is False
    local = ImageStats().score(images, ["", ""], [{}, {}])
    for i, sample in enumerate(stats["samples"]):
        assert sample["score"] is None and sample["error"] is None  # several components, no total
        for name in STATS:
            assert sample["components"][name] == float(local.scores[name][i])
    jpeg = data["results"]["jpeg"]
    expected = JpegCompressibility().score(images, ["", ""], [{}, {}]).scores
    assert [s["score"] for s in jpeg["samples"]] == expected["jpeg_compressibility"].tolist()
    assert jpeg["metrics"] == {
        "failures": 0.0,
        "timeouts": 0.0,
        "jpeg_compressibility/failures": 0.0,
    }


def test_rewards_and_health_describe_the_pools(service):
    info = httpx.get(service + "/rewards", timeout=10).json()
    by_name = {r["name"]: r for r in info["rewards"]}
    assert by_name["stats"]["components"] == list(STATS)
    assert by_name["stats"]["scalar"] is False
    assert by_name["task_and_guard"] == {
        "name": "task_and_guard",
        "target": "unirl.reward.WeightedRewardBackend",
        "components": ["bright", "jpeg"],
        "has_total": True,
        "scalar": True,
        "replicas": 1,
        "timeout_s": 60.0,
        "max_batch_size": 32,
        "device": "cpu",
        "needs_sources": False,
        "scores_videos": False,
    }
    assert by_name["preserve"]["needs_sources"] is True
    assert by_name["bright_frames"]["scores_videos"] is True
    assert by_name["temporal"]["scores_videos"] is True
    assert by_name["video_combo"]["scores_videos"] is False  # an image-only component
    assert by_name["edit_combo"]["needs_sources"] is True  # a component compares with sources
    assert info["auth"] is False
    assert info["limits"]["max_batch_size"] == 256
    health = httpx.get(service + "/health", timeout=10).json()
    assert health["status"] == "ok"
    assert health["rewards"]["jpeg"]["replicas"] == 2
    assert health["uptime_s"] > 0


def uint8_videos(n: int, t: int, seed: int, h: int = 12, w: int = 16) -> torch.Tensor:
    """``[n, t, 3, h, w]`` float32 = k / 255 with random ``uint8`` k (what the server sees)."""
    return uint8_images(n * t, h=h, w=w, seed=seed).view(n, t, 3, h, w)


def test_video_round_trip_equals_in_process(service):
    videos = uint8_videos(5, 4, seed=12)
    prompts = [f"clip {i}" for i in range(5)]
    metadata = [{} for _ in range(5)]
    per_frame = PerFrame(scorer=BrightnessTarget(target=0.5))
    local = per_frame.score_video(videos, 16.0, prompts, metadata).scores["brightness"]
    # batch_size=5: one request, one score_video call on the same [5, 4, 3, H, W] batch
    client = RemoteRewardBackend(url=service, reward="bright_frames", batch_size=5)
    remote = client.score_video(videos, 16.0, prompts, metadata)
    assert torch.equal(remote.scores["bright_frames"], local)
    assert remote.errors["bright_frames"] == [None] * 5

    temporal = RemoteRewardBackend(url=service, reward="temporal")
    local_t = TemporalConsistency().score_video(videos, 16.0, prompts, metadata)
    remote_t = temporal.score_video(videos, 16.0, prompts, metadata)
    assert torch.equal(remote_t.scores["temporal"], local_t.scores["temporal_consistency"])
    # through RewardService: a Videos track reaches score_video with its fps
    track = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        decoded=Videos(frames=videos[:4], fps=16.0),
        prompts=prompts[:4],
        metadata=metadata[:4],
    )
    scored, _ = RewardService(backend=temporal).score_track(track)
    expected = TemporalConsistency().score_video(videos[:4], 16.0, prompts[:4], metadata[:4])
    assert torch.equal(scored.rewards, expected.scores["temporal_consistency"])


def test_videos_as_frame_lists_and_mp4(service):
    frames = uint8_images(3, seed=5)
    body = {
        "reward": "bright_frames",
        "videos": [[as_png(f) for f in frames], [as_png(frames[0])]],
        "fps": 8.0,
    }
    data = httpx.post(service + "/score", json=body, timeout=30).json()
    per_frame = BrightnessTarget(target=0.5).score(frames, [""] * 3, [{}] * 3).scores["brightness"]
    scores = [s["score"] for s in data["results"]["bright_frames"]["samples"]]
    assert data["kind"] == "videos"
    # videos of 3 and 1 frames: two score_video calls, each the mean over its frames
    assert scores == pytest.approx([float(per_frame.mean()), float(per_frame[0])], abs=1e-6)

    av = pytest.importorskip("av", reason="pip install av for mp4 payloads")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for level in (30, 120, 220):
            array = np.full((32, 32, 3), level, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    mp4 = buffer.getvalue()
    with av.open(io.BytesIO(mp4)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 3
    pixels = torch.stack([torch.from_numpy(d.copy()).permute(2, 0, 1) for d in decoded]) / 255.0
    expected = TemporalConsistency().score_video(pixels[None], 8.0, [""], [{}])
    body = {"reward": "temporal", "videos": [base64.b64encode(mp4).decode()], "fps": 8.0}
    data = httpx.post(service + "/score", json=body, timeout=30).json()
    score = data["results"]["temporal"]["samples"][0]["score"]
    assert score == float(expected.scores["temporal_consistency"][0])


def test_image_only_reward_on_videos_fails_per_sample_naming_per_frame(service):
    video = [as_png(f) for f in uint8_images(2, seed=13)]
    body = {"rewards": ["brightness", "video_combo", "temporal"], "videos": [video, video]}
    answer = httpx.post(service + "/score", json={**body, "fps": 8.0}, timeout=30)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    for name in ("brightness", "video_combo"):
        for sample in results[name]["samples"]:
            assert sample["score"] is None
            assert f"reward '{name}'" in sample["error"], sample["error"]
            assert "scores images, not videos" in sample["error"]
            assert "unirl.reward.local.PerFrame" in sample["error"]
    assert [s["error"] for s in results["temporal"]["samples"]] == [None, None]
    # the client refuses it before posting, as the in-process backend does
    client = RemoteRewardBackend(url=service, reward="brightness")
    with pytest.raises(RewardError, match=r"scores images, not videos.*PerFrame"):
        client.score_video(uint8_videos(1, 2, seed=14), 8.0, [""], [{}])


def test_malformed_videos_are_422_naming_the_index(service):
    frame, small = as_png(uint8_images(1)[0]), as_png(uint8_images(1, h=8, w=8)[0])
    cases = {
        "videos[1]: frame 1 is 8x8 but frame 0 is 32x24": {
            "videos": [[frame, frame], [frame, small]],
            "fps": 8.0,
        },
        "videos[0][1]: not valid base64": {"videos": [[frame, "@@"]], "fps": 8.0},
        "'videos' need 'fps'": {"videos": [[frame]]},
        "'fps' goes with 'videos'": {"images": [frame], "fps": 8.0},
        "fps: Input should be greater than 0": {"videos": [[frame]], "fps": 0},
    }
    for message, body in cases.items():
        answer = httpx.post(service + "/score", json={"reward": "temporal", **body}, timeout=30)
        assert answer.status_code == 422, answer.text
        assert message in answer.json()["detail"], answer.json()["detail"]


def test_video_frames_count_against_the_pixel_budgets():
    h, w = 12, 16  # 192 pixels a frame
    app = create_app(
        {
            "server": {"require_auth": False, "max_sample_pixels": 3 * h * w},
            "rewards": {"temporal": {"_target_": "unirl.reward.local.TemporalConsistency"}},
        }
    )
    videos = uint8_videos(1, 4, seed=15, h=h, w=w)
    frames = [as_png(f) for f in videos[0]]
    with serve_in_thread(app) as url:
        three = {"reward": "temporal", "videos": [frames[:3]], "fps": 8.0}
        four = {"reward": "temporal", "videos": [frames], "fps": 8.0}
        assert httpx.post(url + "/score", json=three).status_code == 200
        answer = httpx.post(url + "/score", json=four)
        assert answer.status_code == 413
        assert "videos[0]: decodes to 768 pixels" in answer.json()["detail"]
        # the client's per-request budget counts every frame: 2 videos of 3 frames a request
        client = RemoteRewardBackend(url=url, reward="temporal", batch_size=8)
        client.check()
        client._request_pixels = 2 * 3 * h * w  # as a server with this budget reports
        out = client.score_video(uint8_videos(5, 3, seed=16, h=h, w=w), 8.0, [""] * 5, [{}] * 5)
    assert out.errors["temporal"] == [None] * 5
    assert out.metrics["remote/temporal/failed_samples"] == 0.0


def test_mp4_without_pyav_is_a_clear_422(service, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "av", None)  # the server runs in this process
    body = {"reward": "brightness", "videos": [base64.b64encode(b"not really").decode()], "fps": 8}
    answer = httpx.post(service + "/score", json=body, timeout=30)
    assert answer.status_code == 422
    assert "videos[0]: mp4 videos need PyAV" in answer.json()["detail"]
    assert "unirl-reward-service[video]" in answer.json()["detail"]


# -- edits: results with their sources -----------------------------------------------------------

EDIT_META = [
    {"edit_box": [0.25, 0.25, 0.75, 0.75], "target_color": [1.0, 0.0, 0.0]},
    {"edit_box": [0.0, 0.0, 0.5, 1.0], "target_color": [0.0, 0.0, 1.0]},
    {"target_color": [0.2, 0.9, 0.1]},  # whole image: nothing to preserve (a per-sample NaN)
    {"edit_box": [0.5, 0.5, 1.0, 1.0], "target_color": [1.0, 1.0, 1.0]},
    {"edit_box": [0.1, 0.2, 0.6, 0.9], "target_color": [0.0, 0.0, 0.0]},
]


def test_edit_round_trip_equals_in_process(service):
    results, sources = uint8_images(5, seed=6), uint8_images(5, seed=7)
    prompts = [f"edit {i}" for i in range(5)]
    local = SourcePreservation().score_edit(results, sources, prompts, EDIT_META)
    # batch_size=2: three requests; every sample is scored alone or with same-sized peers,
    # and SourcePreservation's per-sample arithmetic does not depend on the batch
    client = RemoteRewardBackend(url=service, reward="preserve", batch_size=2)
    remote = client.score_edit(results, sources, prompts, EDIT_META)
    torch.testing.assert_close(  # exact, NaN at 2 on both sides
        remote.scores["preserve"], local.scores["preserve"], rtol=0, atol=0, equal_nan=True
    )
    assert remote.errors["preserve"][2] == local.errors["preserve"][2]
    assert [e is None for e in remote.errors["preserve"]] == [True, True, False, True, True]

    combo = WeightedRewardBackend(
        components={
            "preserve": SourcePreservation(),
            "region": RegionColorTarget(relative=True),
            "jpeg": JpegCompressibility(),
        },
        weights={"preserve": 1.0, "region": 2.0, "jpeg": 0.0},
    )
    keep = [0, 1, 3, 4]  # sample 2 has no pixel to preserve
    expected = combo.score_edit(
        results[keep], sources[keep], [prompts[i] for i in keep], [EDIT_META[i] for i in keep]
    )
    reward_service = RewardService(
        backend=RemoteRewardBackend(
            url=service,
            reward="edit_combo",
            components=["preserve", "region", "jpeg"],
            use_total=True,
        )
    )
    track = RolloutTrack(
        sample_ids=torch.arange(4),
        group_ids=torch.tensor([0, 0, 1, 1]),
        decoded=Images(pixels=results[keep]),
        prompts=[prompts[i] for i in keep],
        metadata=[EDIT_META[i] for i in keep],
        references=Images(pixels=sources[keep]),
    )
    scored, metrics = reward_service.score_track(track)
    assert torch.equal(scored.rewards, expected.total)
    for name in ("preserve", "region", "jpeg"):
        assert torch.equal(scored.component_rewards[name], expected.scores[name]), name
    assert metrics["reward/dropped_groups"] == 0.0


def test_edit_reward_without_sources_fails_per_sample(service):
    results = uint8_images(2, seed=8)
    client = RemoteRewardBackend(url=service, reward="preserve")
    out = client.score(results, ["a", "b"], EDIT_META[:2])
    assert torch.isnan(out.scores["preserve"]).all()
    for error in out.errors["preserve"]:
        assert error is not None
        assert "reward 'preserve'" in error and "send 'sources'" in error
    # a reward of the result alone scores an edit as it scores the image
    jpeg = RemoteRewardBackend(url=service, reward="jpeg")
    sources = uint8_images(2, seed=9)
    with_sources = jpeg.score_edit(results, sources, ["a", "b"], [{}, {}])
    assert torch.equal(
        with_sources.scores["jpeg"], jpeg.score(results, ["a", "b"], [{}, {}]).scores["jpeg"]
    )


def test_sources_of_another_size_reach_the_scorer(service):
    results, sources = uint8_images(1, seed=10), uint8_images(1, h=16, w=16, seed=11)
    client = RemoteRewardBackend(url=service, reward="preserve")
    out = client.score_edit(results, sources, ["a"], EDIT_META[:1])
    assert torch.isnan(out.scores["preserve"]).all()
    assert "sources (1, 3, 16, 16) and results (1, 3, 24, 32) differ" in out.errors["preserve"][0]


def test_malformed_sources_are_422_naming_the_index(service):
    image = as_png(uint8_images(1)[0])
    cases = {
        "'sources' has 1 entries for 2 images": {"images": [image, image], "sources": [image]},
        "sources[1]: not valid base64": {"images": [image, image], "sources": [image, "@@"]},
        "'sources' go with 'images'": {"videos": [[image]], "sources": [image]},
    }
    for message, body in cases.items():
        answer = httpx.post(service + "/score", json={"reward": "preserve", **body}, timeout=30)
        assert answer.status_code == 422, answer.text
        assert message in answer.json()["detail"], answer.json()["detail"]


def test_sources_count_against_the_pixel_budgets():
    app = create_app(
        {
            "server": {"require_auth": False, "max_sample_pixels": 24 * 32 + 100},
            "rewards": {"preserve": {"_target_": "unirl.reward.local.SourcePreservation"}},
        }
    )
    image = as_png(uint8_images(1)[0])
    with serve_in_thread(app) as url:
        alone = httpx.post(url + "/score", json={"reward": "preserve", "images": [image]})
        edit = {"reward": "preserve", "images": [image], "sources": [image]}
        both = httpx.post(url + "/score", json=edit)
    assert alone.status_code == 200
    assert both.status_code == 413 and "images[0]: decodes to 1536 pixels" in both.json()["detail"]


# -- OCR through the service ---------------------------------------------------------------


def _render(text: str, width: int = 320, height: int = 96) -> torch.Tensor:
    font = ImageFont.load_default(size=40)
    if not isinstance(font, ImageFont.FreeTypeFont):
        pytest.skip("Pillow was built without FreeType: no TrueType font to render test text")
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    origin = ((width - (right - left)) / 2 - left, (height - (bottom - top)) / 2 - top)
    draw.text(origin, text, fill="black", font=font)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255.0


def test_ocr_through_the_service_equals_in_process():
    pytest.importorskip("rapidocr_onnxruntime", reason="pip install 'unirl-mm[ocr]' for OCR tests")
    images = torch.stack([_render("LIGHTHOUSE"), _render("OPEN LATE"), torch.ones(3, 96, 320)])
    prompts = ['A sign that says "LIGHTHOUSE"', 'A sign that says "LIGHTHOUSX"', 'blank "HELLO"']
    metadata = [{}, {"target_text": "open late"}, {}]
    app = create_app(
        {
            "server": {"require_auth": False},
            "rewards": {"ocr": {"_target_": "unirl.reward.local.OCRScorer"}},
        }
    )
    with serve_in_thread(app) as url:
        remote = RemoteRewardBackend(url=url, reward="ocr").score(images, prompts, metadata)
    local = OCRScorer().score(images, prompts, metadata)
    assert torch.equal(remote.scores["ocr"], local.scores["ocr"])  # same pixels, same engine
    assert remote.scores["ocr"].tolist() == [1.0, 1.0, 0.0]
