"""SDE-step schedules: determinism, ranges, group sharing and errors."""

from __future__ import annotations

import pytest

from unirl.config import ConfigError
from unirl.sde import AllSteps, RandomSubsetSchedule, WindowSchedule


def test_all_steps():
    assert AllSteps().select(10, seed=0) == tuple(range(9))
    assert AllSteps(exclude_last=False).select(10, seed=5, rollout_index=3) == tuple(range(10))
    assert AllSteps(exclude_last=False).select(1, seed=0) == (0,)
    with pytest.raises(ValueError, match="num_inference_steps >= 2"):
        AllSteps().select(1, seed=0)


def test_random_subset_canonical_recipe_is_first_nine_of_ten():
    schedule = RandomSubsetSchedule(num_steps=9, fraction=(0.0, 0.99))
    assert schedule.candidates(10) == range(0, 9)
    assert schedule.select(10, seed=123) == tuple(range(9))


def test_random_subset_deterministic_sorted_unique_in_range():
    schedule = RandomSubsetSchedule(num_steps=3, fraction=(0.2, 0.8))
    assert schedule.candidates(40) == range(8, 32)
    seen = set()
    for seed in range(50):
        picked = schedule.select(40, seed=seed, rollout_index=2)
        assert picked == schedule.select(40, seed=seed, rollout_index=2)
        assert list(picked) == sorted(set(picked)) and len(picked) == 3
        assert all(8 <= i < 32 for i in picked)
        seen.add(picked)
    assert len(seen) > 40  # different seeds really give different subsets
    assert schedule.select(40, seed=1, rollout_index=0) != schedule.select(
        40, seed=1, rollout_index=1
    )


def test_random_subset_fraction_rounding_and_errors():
    # 0.29 * 100 = 28.999999999999996 in floating point; the bound must still be 29.
    assert RandomSubsetSchedule(num_steps=1, fraction=(0.0, 0.29)).candidates(100) == range(0, 29)
    with pytest.raises(ValueError, match="only 2 candidate steps"):
        RandomSubsetSchedule(num_steps=3, fraction=(0.0, 0.5)).select(4, seed=0)
    with pytest.raises(ConfigError, match="fraction"):
        RandomSubsetSchedule(num_steps=1, fraction=(0.6, 0.5))
    with pytest.raises(ConfigError, match="fraction"):
        RandomSubsetSchedule(num_steps=1, fraction=(0.0, 0.5, 1.0))
    with pytest.raises(ConfigError, match="num_steps"):
        RandomSubsetSchedule(num_steps=0)
    with pytest.raises(ValueError, match="seed"):
        RandomSubsetSchedule(num_steps=1).select(10, seed=-1)
    # Hydra passes lists; they become a tuple.
    assert RandomSubsetSchedule(num_steps=1, fraction=[0, 1]).fraction == (0.0, 1.0)


def test_fixed_window():
    assert WindowSchedule(size=3, start=2).select(10, seed=0) == (2, 3, 4)
    assert WindowSchedule(size=9).select(10, seed=0) == tuple(range(9))
    with pytest.raises(ValueError, match="does not fit"):
        WindowSchedule(size=3, start=7).select(10, seed=0)
    assert WindowSchedule(size=3, start=7, exclude_last=False).select(10, seed=0) == (7, 8, 9)


def test_progressive_window_moves_and_holds_at_max_start():
    schedule = WindowSchedule(size=2, stride=1, shift_interval=3, progressive=True, max_start=4)
    starts = [schedule.select(10, seed=0, rollout_index=k)[0] for k in range(20)]
    assert starts == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4]
    default_max = WindowSchedule(size=2, stride=4, progressive=True)
    assert default_max.select(10, seed=0, rollout_index=10) == (7, 8)


def test_random_window_flow_grpo_fast():
    schedule = WindowSchedule(size=3, random=True, max_start=2)
    starts = {schedule.select(10, seed=s)[0] for s in range(60)}
    assert starts == {0, 1, 2}
    picked = schedule.select(10, seed=17, rollout_index=4)
    assert picked == schedule.select(10, seed=17, rollout_index=4)
    assert picked == tuple(range(picked[0], picked[0] + 3))


def test_window_config_errors():
    with pytest.raises(ConfigError, match="not both"):
        WindowSchedule(size=2, progressive=True, random=True, stride=1)
    with pytest.raises(ConfigError, match="stride"):
        WindowSchedule(size=2, progressive=True)
    with pytest.raises(ConfigError, match="size"):
        WindowSchedule(size=0)
    with pytest.raises(ConfigError, match="max_start"):
        WindowSchedule(size=2, start=3, max_start=1)
    with pytest.raises(ValueError, match="does not fit"):
        WindowSchedule(size=3, random=True, max_start=8).select(10, seed=0)
