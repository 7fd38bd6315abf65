"""RewardService failure policies and metrics; WeightedRewardBackend math; Hydra building."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from unirl.config import ConfigError
from unirl.reward import (
    RewardBackend,
    RewardError,
    RewardService,
    ScoreResult,
    WeightedRewardBackend,
    batch_zscore,
)
from unirl.reward.local import BrightnessTarget, ExactMatch, ImageStats
from unirl.types import STATUS_DROPPED, STATUS_OK, Images, RolloutTrack, Texts


@dataclass(kw_only=True)
class Fixed(RewardBackend):
    """Returns preset scores (one component) whatever the images."""

    name: str
    values: list[float]
    error: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        errors = [self.error if math.isnan(v) else None for v in self.values]
        return ScoreResult(
            scores={self.name: torch.tensor(self.values, dtype=torch.float32)},
            errors={self.name: errors},
        )


def _track(n: int = 6, group_size: int = 2) -> RolloutTrack:
    return RolloutTrack(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // group_size,
        prompts=[f"prompt {i}" for i in range(n)],
        metadata=[{} for _ in range(n)],
        decoded=Images(pixels=torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))),
    )


def test_single_backend_attaches_rewards_and_metrics():
    values = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    service = RewardService(backend=Fixed(name="r", values=values))
    track, metrics = service.score_track(_track())
    assert track.rewards.tolist() == values
    assert track.component_rewards["r"].tolist() == values
    assert track.status.tolist() == [STATUS_OK] * 6
    assert metrics["reward/mean"] == pytest.approx(2.5, abs=1e-6)
    assert metrics["reward/std"] == pytest.approx(math.sqrt(35 / 12), abs=1e-6)  # population std
    assert metrics["reward/r/mean"] == pytest.approx(2.5, abs=1e-6)
    assert metrics["reward/dropped_groups"] == 0.0


def test_raise_policy_names_component_sample_and_prompt():
    values = [0.0, 1.0, 2.0, math.nan, 4.0, 5.0]
    service = RewardService(backend=Fixed(name="ocr", values=values, error="engine timed out"))
    with pytest.raises(RewardError) as info:
        service.score_track(_track())
    message = str(info.value)
    assert "reward component 'ocr'" in message
    assert "sample 3 of 6" in message
    assert "'prompt 3'" in message
    assert "engine timed out" in message
    assert "failure_policy=drop_group" in message


def test_raise_policy_catches_inf_and_missing_component():
    service = RewardService(backend=Fixed(name="r", values=[0.0, math.inf, 0, 0, 0, 0]))
    with pytest.raises(RewardError, match="'r' is inf for sample 1"):
        service.score_track(_track())

    class Missing(Fixed):
        def score(self, images, prompts, metadata):
            return ScoreResult(scores={"other": torch.zeros(len(prompts))})

    with pytest.raises(RewardError, match="declared reward component 'r' but returned none"):
        RewardService(backend=Missing(name="r", values=[])).score_track(_track())


def test_drop_group_marks_whole_groups_and_counts_them():
    # groups: {0,1} {2,3} {4,5}; samples 3 and 4 fail -> groups 1 and 2 dropped
    values = [1.0, 3.0, 5.0, math.nan, math.nan, 7.0]
    service = RewardService(backend=Fixed(name="r", values=values), failure_policy="drop_group")
    track, metrics = service.score_track(_track())
    assert track.status.tolist() == [0, 0, 1, 1, 1, 1]
    assert track.status.tolist() == [STATUS_OK] * 2 + [STATUS_DROPPED] * 4
    assert track.rewards.tolist() == [1.0, 3.0, 5.0, 0.0, 0.0, 7.0]  # NaN -> 0 in dropped groups
    assert torch.isfinite(track.component_rewards["r"]).all()
    assert metrics["reward/dropped_groups"] == 2.0
    assert metrics["reward/dropped_samples"] == 4.0
    assert metrics["reward/failures/r"] == 2.0
    assert metrics["reward/mean"] == pytest.approx(2.0, abs=1e-6)  # kept samples only
    # the advantage step accepts the result (dropped samples are excluded there)
    with_adv, _ = track.compute_advantages()
    assert with_adv.advantages[2:].tolist() == [0.0] * 4


def test_already_dropped_samples_do_not_fail():
    track = _track()
    track.status[5] = STATUS_DROPPED
    values = [0.0, 1.0, 2.0, 3.0, 4.0, math.nan]
    scored, metrics = RewardService(backend=Fixed(name="r", values=values)).score_track(track)
    assert scored.status.tolist() == [0, 0, 0, 0, 0, 1]
    assert metrics["reward/mean"] == pytest.approx(2.0, abs=1e-6)


def test_guards_are_logged_not_rewarded():
    n = 4
    pixels = torch.zeros(n, 3, 8, 8)
    pixels[:2] = 1.0
    track = RolloutTrack(
        sample_ids=torch.arange(n),
        group_ids=torch.zeros(n, dtype=torch.long),
        prompts=["p"] * n,
        decoded=Images(pixels=pixels),
    )
    service = RewardService(backend=BrightnessTarget(target=1.0), guards=[ImageStats()])
    scored, metrics = service.score_track(track)
    assert set(scored.component_rewards) == {"brightness"}
    assert scored.rewards.tolist() == [0.0, 0.0, -1.0, -1.0]
    assert metrics["guard/dark_fraction/mean"] == 0.5
    assert metrics["guard/color_entropy/mean"] == 0.0
    assert metrics["guard/edge_density/mean"] == 0.0


def test_text_tracks_use_score_texts():
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.zeros(2, dtype=torch.long),
        prompts=["q1", "q2"],
        metadata=[{"answer": "yes"}, {"answer": "no"}],
        decoded=Texts(texts=["Yes", "maybe"]),
    )
    scored, _ = RewardService(backend=ExactMatch()).score_track(track)
    assert scored.rewards.tolist() == [1.0, 0.0]
    with pytest.raises(TypeError, match="track decoded texts"):
        RewardService(backend=BrightnessTarget()).score_track(track)


def test_weighted_backend_math_is_exact():
    a = Fixed(name="a", values=[1.0, 2.0, 3.0])
    b = Fixed(name="b", values=[10.0, 0.0, -10.0])
    backend = WeightedRewardBackend(
        components={"ocr": a, "aux": b}, weights={"ocr": 2.0, "aux": 0.5}
    )
    result = backend.score(None, ["x"] * 3, [{}] * 3)
    assert backend.names == ("ocr", "aux")
    assert result.total.tolist() == [2 * 1 + 5.0, 2 * 2 + 0.0, 2 * 3 - 5.0]
    assert result.scores["ocr"].tolist() == [1.0, 2.0, 3.0]  # raw components kept

    zs = WeightedRewardBackend(
        components={"ocr": a, "aux": b}, weights={"ocr": 1.0, "aux": 1.0}, normalize="batch_zscore"
    ).score(None, ["x"] * 3, [{}] * 3)
    z = math.sqrt(3 / 2)  # (v - mean) / population std for three evenly spaced values
    assert zs.total.tolist() == pytest.approx([-z + z, 0.0, z - z], abs=1e-5)


def test_weighted_backend_multi_name_components_and_zero_weights():
    stats = ImageStats()
    backend = WeightedRewardBackend(
        components={"bright": BrightnessTarget(target=1.0), "stats": stats},
        weights={
            "bright": 1.0,
            "stats/dark_fraction": -2.0,
            "stats/color_entropy": 0.0,
            "stats/edge_density": 0.0,
        },
    )
    pixels = torch.zeros(2, 3, 4, 4)
    pixels[0] = 1.0
    result = backend.score(pixels, ["a", "b"], [{}, {}])
    assert result.total.tolist() == [0.0, -1.0 - 2.0]
    assert set(result.scores) == {"bright", *(f"stats/{n}" for n in stats.names)}
    service = RewardService(backend=backend)
    assert service.names == backend.names


def test_weighted_backend_config_errors():
    a = Fixed(name="a", values=[1.0])
    with pytest.raises(ConfigError, match=r"no entry for \['b'\]"):
        WeightedRewardBackend(components={"a": a, "b": a}, weights={"a": 1.0})
    with pytest.raises(ConfigError, match=r"unknown components \['c'\]"):
        WeightedRewardBackend(components={"a": a}, weights={"a": 1.0, "c": 1.0})
    with pytest.raises(ConfigError, match="normalize"):
        WeightedRewardBackend(components={"a": a}, weights={"a": 1.0}, normalize="group")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="WeightedRewardBackend"):
        RewardService(backend=ImageStats())  # three components and no weights


def test_batch_zscore_ignores_nan_for_statistics():
    out = batch_zscore(torch.tensor([1.0, math.nan, 3.0]), eps=0.0)
    assert out[0].item() == -1.0 and out[2].item() == 1.0 and math.isnan(out[1].item())


def test_hydra_instantiates_the_service():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "_target_": "unirl.reward.RewardService",
            "failure_policy": "drop_group",
            "backend": {
                "_target_": "unirl.reward.WeightedRewardBackend",
                "components": {
                    "color": {"_target_": "unirl.reward.local.ColorTarget", "rgb": [0.0, 0.0, 1.0]},
                    "bright": {"_target_": "unirl.reward.local.BrightnessTarget", "target": 0.5},
                },
                "weights": {"color": 1.0, "bright": 0.5},
            },
            "guards": [{"_target_": "unirl.reward.local.ImageStats"}],
        }
    )
    service = instantiate(cfg)
    assert isinstance(service, RewardService)
    assert isinstance(service.guards, list) and isinstance(service.guards[0], ImageStats)
    assert service.backend.weights == {"color": 1.0, "bright": 0.5}
    assert service.backend.components["color"].rgb == (0.0, 0.0, 1.0)
    scored, metrics = service.score_track(_track())
    assert scored.rewards.shape == (6,) and "guard/edge_density/mean" in metrics
