"""``reward.failure_policy=drop_group`` needs whole prompt groups on every data-parallel rank."""

from __future__ import annotations

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.validate import validate

DROP = "+reward.failure_policy=drop_group"


def _validate(recipe: str, overrides: list[str]) -> None:
    validate(compose_recipe(f"diffusion/{recipe}", overrides))


def test_whole_groups_per_rank_pass_and_raise_policy_is_not_bound_by_it() -> None:
    # 4 prompts x 4 samples over 2 ranks: 8 samples, two whole groups per rank
    _validate(
        "sd3_tiny_trainside", [DROP, "num_devices=2", "batch_size=4", "stack.micro_batch_size=2"]
    )
    # 3 prompts over 2 ranks straddle a group, which only drop_group cares about
    _validate("sd3_tiny_trainside", ["num_devices=2", "batch_size=3", "stack.micro_batch_size=2"])


def test_the_train_slab_is_checked_too() -> None:
    """Separate layout, 1 rollout rank and 2 train ranks: 1 prompt x 4 samples is whole on the
    rollout rank but split in halves over the train ranks."""
    overrides = ["num_devices=3", "train_fraction=0.67", "batch_size=1", "stack.micro_batch_size=2"]
    _validate("sd3_tiny_dedicated_separate", overrides)
    with pytest.raises(ConfigError) as info:
        _validate("sd3_tiny_dedicated_separate", [DROP, *overrides])
    assert str(info.value) == (
        "reward.failure_policy=drop_group drops whole prompt groups, but batch_size=1 prompts "
        "over 2 train data-parallel ranks give 2 samples per rank, not a multiple of "
        "sampling.samples_per_prompt=4, so a group straddles two ranks; make batch_size a "
        "multiple of 2 or set reward.failure_policy=raise"
    )
