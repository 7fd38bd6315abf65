"""``advantages_for``: the trainer's one call from a scored track to advantages. Default path is
exactly ``RolloutTrack.compute_advantages``; ``advantage.component_weights`` selects GDPO-style
per-component normalisation (checked against a plain-Python implementation), clipped, with the
same metric keys; bad weights and unknown components fail with their messages."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.algorithms.advantages import advantages_for
from unirl.config import ConfigError
from unirl.config.run import AdvantageConfig, RunConfig
from unirl.types import RolloutTrack

GROUPS = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
KEYS = {"advantage/mean", "advantage/std", "advantage/abs_max", "advantage/zero_std_ratio"}


def _track(dropped: tuple[int, ...] = (), components: bool = True) -> RolloutTrack:
    gen = torch.Generator().manual_seed(3)
    n = len(GROUPS)
    ocr = torch.rand(n, generator=gen)
    aesthetic = 10.0 * torch.rand(n, generator=gen)
    pick = torch.rand(n, generator=gen)
    ocr[9:12] = 0.25  # group 3: every weighted component constant ...
    aesthetic[9:12] = 4.0
    pick[9:12] = torch.tensor([0.1, 0.9, 0.5])  # ... only the unweighted one varies
    status = torch.zeros(n, dtype=torch.long)
    status[list(dropped)] = 1
    return RolloutTrack(
        sample_ids=torch.arange(n),
        group_ids=torch.tensor(GROUPS),
        rewards=ocr + 0.1 * aesthetic,
        component_rewards={"ocr": ocr, "aesthetic": aesthetic, "pick": pick}
        if components
        else None,
        status=status,
    )


def _z(xs: list[float], eps: float) -> list[float]:
    if max(xs) == min(xs):
        return [0.0] * len(xs)
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    return [(x - m) / (s + eps) for x in xs]


def _reference(track: RolloutTrack, weights: dict[str, float], eps: float, clip, batch_norm):
    kept = track.kept.tolist()
    n = len(kept)
    total = [0.0] * n
    for name, w in weights.items():
        values = track.component_rewards[name].double().tolist()
        for g in sorted({GROUPS[i] for i in range(n) if kept[i]}):
            idx = [i for i in range(n) if GROUPS[i] == g and kept[i]]
            for i, z in zip(idx, _z([values[i] for i in idx], eps)):
                total[i] += w * z
    idx = [i for i in range(n) if kept[i]]
    out = [0.0] * n
    vals = _z([total[i] for i in idx], eps) if batch_norm else [total[i] for i in idx]
    for i, v in zip(idx, vals):
        out[i] = v if clip is None else min(max(v, -clip), clip)
    return out


def test_default_is_exactly_compute_advantages() -> None:
    track = _track(dropped=(4,))
    cfg = AdvantageConfig(scope="group", std="batch", eps=1e-4, clip=1.0)
    got, metrics = advantages_for(track, cfg)
    want, want_metrics = track.compute_advantages(scope="group", std="batch", eps=1e-4, clip=1.0)
    assert torch.equal(got.advantages, want.advantages) and metrics == want_metrics
    assert set(metrics) == KEYS


@pytest.mark.parametrize("batch_norm", [True, False])
@pytest.mark.parametrize("clip", [None, 0.8])
def test_component_weights_select_gdpo(batch_norm: bool, clip) -> None:
    track = _track(dropped=(1,))
    weights = {"ocr": 1.0, "aesthetic": 0.5}  # a subset: "pick" is not used
    cfg = AdvantageConfig(
        component_weights=weights, component_batch_norm=batch_norm, eps=1e-4, clip=clip
    )
    got, metrics = advantages_for(track, cfg)
    want = torch.tensor(_reference(track, weights, 1e-4, clip, batch_norm), dtype=torch.float64)
    assert got.advantages.dtype == torch.float32
    torch.testing.assert_close(got.advantages.double(), want, atol=1e-6, rtol=0)
    assert got.advantages[1] == 0.0  # dropped
    if clip is not None:
        assert float(got.advantages.abs().max()) == pytest.approx(clip)  # the clip bites
    assert set(metrics) == KEYS
    kept = want[track.kept]
    assert metrics["advantage/mean"] == pytest.approx(float(kept.mean()), abs=1e-6)
    assert metrics["advantage/std"] == pytest.approx(float(kept.std(unbiased=False)), abs=1e-6)
    assert metrics["advantage/abs_max"] == pytest.approx(float(kept.abs().max()), abs=1e-6)
    assert metrics["advantage/zero_std_ratio"] == 0.25  # group 3 of 4
    assert torch.equal(got.rewards, track.rewards)  # nothing else changes


def test_gdpo_differs_from_the_total_reward_advantage() -> None:
    track = _track()
    gdpo, _ = advantages_for(
        track, AdvantageConfig(component_weights={"ocr": 1.0, "aesthetic": 0.1})
    )
    plain, _ = advantages_for(track, AdvantageConfig(std="group"))
    assert not torch.allclose(gdpo.advantages, plain.advantages, atol=1e-3)


def test_unknown_components_fail_at_the_first_rollout_naming_them() -> None:
    cfg = AdvantageConfig(component_weights={"ocr": 1.0, "geneval": 1.0, "clip_score": 0.5})
    with pytest.raises(
        ConfigError, match=r"\['clip_score', 'geneval'\].*\['aesthetic', 'ocr', 'pick'\]"
    ):
        advantages_for(_track(), cfg)
    with pytest.raises(ConfigError, match="a single scorer has no components"):
        advantages_for(_track(components=False), AdvantageConfig(component_weights={"ocr": 1.0}))


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"ocr": -1.0}, r"component_weights\.ocr must be a finite weight >= 0, got -1\.0"),
        ({"ocr": float("nan")}, r"component_weights\.ocr must be a finite weight >= 0, got nan"),
        ({"ocr": float("inf")}, r"got inf"),
        ({"ocr": True}, r"got True"),
        ({"ocr": "1"}, r"got '1'"),
        ({}, "non-empty mapping"),
        ({"ocr": 0.0, "pick": 0}, "every weight is 0"),
    ],
)
def test_bad_component_weights_are_config_errors(weights, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AdvantageConfig(component_weights=weights)


def test_component_weights_config_shape() -> None:
    cfg = AdvantageConfig(component_weights={"ocr": 1, "pick": 0})
    assert cfg.component_weights == {"ocr": 1.0, "pick": 0.0}
    assert all(type(w) is float for w in cfg.component_weights.values())
    with pytest.raises(ConfigError, match=r"set advantage\.scope=group"):
        AdvantageConfig(scope="global", component_weights={"ocr": 1.0})
    run = RunConfig.from_dict(
        {"advantage": {"component_weights": {"ocr": 2.0}, "component_batch_norm": False}}
    )
    assert run.advantage.component_weights == {"ocr": 2.0}
    assert run.advantage.component_batch_norm is False


def test_zero_weight_components_do_not_count_for_zero_std_groups() -> None:
    track = _track()
    weights = {"ocr": 1.0, "aesthetic": 0.5, "pick": 0.0}  # pick varies in group 3, weight 0
    got, metrics = advantages_for(track, AdvantageConfig(component_weights=weights, clip=None))
    assert metrics["advantage/zero_std_ratio"] == 0.25
    want = torch.tensor(_reference(track, weights, 1e-4, None, True), dtype=torch.float64)
    torch.testing.assert_close(got.advantages.double(), want, atol=1e-6, rtol=0)
