"""Video rewards: per-frame aggregation (mean / min, stride, failures), temporal consistency,
the video PickScore against a hand computation on a tiny CLIP, and the service's dispatch."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from test_reward_models import MEAN, STD, _clip_vocab, _ref_shortest_crop, _tiny_clip_config

from unirl.config import ConfigError
from unirl.reward import RewardError, WeightedRewardBackend
from unirl.reward.base import RewardBackend, ScoreResult
from unirl.reward.local import BrightnessTarget, PerFrame, TemporalConsistency, VideoPickScore
from unirl.reward.local.video import frame_indices
from unirl.reward.service import RewardService
from unirl.types import RolloutTrack, Videos


def _ramp(n: int = 2, t: int = 4) -> torch.Tensor:
    """Video i, frame j is flat grey at (i + 1) * (j + 1) / 10."""
    frames = torch.empty(n, t, 3, 4, 4)
    for i in range(n):
        for j in range(t):
            frames[i, j] = (i + 1) * (j + 1) / 10
    return frames


def test_frame_indices_keep_the_last_frame() -> None:
    assert frame_indices(5, 1) == [0, 1, 2, 3, 4]
    assert frame_indices(5, 2) == [0, 2, 4]
    assert frame_indices(6, 4) == [0, 4, 5]
    assert frame_indices(1, 3) == [0]


@pytest.mark.parametrize(
    ("aggregate", "stride", "expected"),
    [
        # brightness reward -|mean - 0.8|; video 0 frames 0.1..0.4, video 1 frames 0.2..0.8
        ("mean", 1, [-(0.7 + 0.6 + 0.5 + 0.4) / 4, -(0.6 + 0.4 + 0.2 + 0.0) / 4]),
        ("min", 1, [-0.7, -0.6]),
        ("mean", 2, [-(0.7 + 0.5 + 0.4) / 3, -(0.6 + 0.2 + 0.0) / 3]),  # frames 0, 2, 3
    ],
)
def test_per_frame_aggregates_an_image_scorer_over_time(
    aggregate: str, stride: int, expected: list[float]
) -> None:
    scorer = PerFrame(scorer=BrightnessTarget(target=0.8), aggregate=aggregate, frame_stride=stride)
    out = scorer.score_video(_ramp(), 8.0, ["a", "b"], [{}, {}])
    assert out.scores["brightness"].tolist() == pytest.approx(expected, abs=1e-6)
    assert out.errors["brightness"] == [None, None]


class _FailsOnBright(RewardBackend):
    """Scores brightness, NaN (with a reason) for frames brighter than 0.5."""

    @property
    def names(self) -> tuple[str, ...]:
        return ("b",)

    def score(self, images, prompts, metadata) -> ScoreResult:
        mean = images.mean(dim=(1, 2, 3))
        bad = mean > 0.5
        return ScoreResult(
            scores={"b": torch.where(bad, torch.full_like(mean, math.nan), mean)},
            errors={"b": ["too bright" if x else None for x in bad.tolist()]},
        )


def test_a_failed_frame_fails_its_video_with_the_frame_named() -> None:
    out = PerFrame(scorer=_FailsOnBright()).score_video(_ramp(), 8.0, ["a", "b"], [{}, {}])
    assert out.scores["b"][0] == pytest.approx(0.25)
    assert math.isnan(float(out.scores["b"][1]))
    assert out.errors["b"] == [None, "frame 2: too bright"]  # video 1 frame 2 is 0.6


def test_per_frame_refuses_an_unknown_aggregate() -> None:
    with pytest.raises(ConfigError, match=r"PerFrame\.aggregate='median'"):
        PerFrame(scorer=BrightnessTarget(), aggregate="median")


def test_temporal_consistency_is_one_minus_the_mean_frame_change() -> None:
    out = TemporalConsistency().score_video(_ramp(), 8.0, ["a", "b"], [{}, {}])
    assert out.scores["temporal_consistency"].tolist() == pytest.approx([0.9, 0.8], abs=1e-6)
    still = TemporalConsistency().score_video(_ramp(t=1), 8.0, ["a", "b"], [{}, {}])
    assert still.scores["temporal_consistency"].tolist() == [1.0, 1.0]


def test_an_image_scorer_on_videos_is_refused_with_the_wrapper_named() -> None:
    with pytest.raises(RewardError, match=r"unirl\.reward\.local\.PerFrame"):
        BrightnessTarget().score_video(_ramp(), 8.0, ["a", "b"], [{}, {}])


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_clip_video")
    torch.manual_seed(0)
    transformers.CLIPModel(_tiny_clip_config()).save_pretrained(path)
    transformers.CLIPTokenizer(vocab=_clip_vocab(), merges=[]).save_pretrained(path)
    transformers.CLIPImageProcessor(
        size={"shortest_edge": 32},
        crop_size={"height": 32, "width": 32},
        image_mean=list(MEAN),
        image_std=list(STD),
    ).save_pretrained(path)
    return str(path)


def test_video_pickscore_pools_frame_embeddings_then_scores_like_pickscore(clip_dir) -> None:
    torch.manual_seed(1)
    frames = torch.rand(2, 5, 3, 48, 40)  # the size _ref_shortest_crop is written for
    prompts = ["a cat", "a dog"]
    model = transformers.CLIPModel.from_pretrained(clip_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(clip_dir)
    chosen = [0, 2, 4]
    with torch.no_grad():
        pixels = _ref_shortest_crop(frames[:, chosen].flatten(0, 1), MEAN, STD)
        vision = model.vision_model(pixel_values=pixels).pooler_output
        image = torch.nn.functional.normalize(model.visual_projection(vision), dim=-1)
        pooled = torch.nn.functional.normalize(image.view(2, 3, -1).mean(dim=1), dim=-1)
        text_in = tok(prompts, padding="max_length", max_length=16, return_tensors="pt")
        words = model.text_model(**text_in).pooler_output
        text = torch.nn.functional.normalize(model.text_projection(words), dim=-1)
        expected = model.logit_scale.exp() * (pooled * text).sum(dim=-1)
    scorer = VideoPickScore(model=clip_dir, processor=clip_dir, frame_stride=2)
    out = scorer.score_video(frames, 16.0, prompts, [{}, {}])
    torch.testing.assert_close(out.scores["video_pickscore"], expected, rtol=1e-5, atol=1e-5)
    reversed_time = scorer.score_video(frames.flip(1), 16.0, prompts, [{}, {}])
    torch.testing.assert_close(  # mean pooling: frames 4, 2, 0 are the same set
        reversed_time.scores["video_pickscore"], expected, rtol=1e-5, atol=1e-5
    )


def test_service_scores_a_video_track_with_a_weighted_video_reward() -> None:
    backend = WeightedRewardBackend(
        components={
            "brightness": PerFrame(scorer=BrightnessTarget(target=0.8), aggregate="min"),
            "temporal_consistency": TemporalConsistency(),
        },
        weights={"brightness": 1.0, "temporal_consistency": 0.5},
    )
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.zeros(2, dtype=torch.long),
        prompts=["a", "b"],
        decoded=Videos(frames=_ramp(), fps=8.0),
    )
    service = RewardService(backend=backend, guards=[TemporalConsistency(name="flicker")])
    scored, metrics = service.score_track(track)
    assert scored.rewards.tolist() == pytest.approx([-0.7 + 0.45, -0.6 + 0.4], abs=1e-6)
    assert metrics["guard/flicker/mean"] == pytest.approx(0.85, abs=1e-6)
