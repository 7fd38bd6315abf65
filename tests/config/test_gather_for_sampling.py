"""``backend.fsdp.gather_for_sampling``: a knob of sharded runs that sample with the trainer's
own module (the trainside engine); refused by name elsewhere, before anything is built. What
it does on two ranks is tested in tests/train/test_train_fsdp.py (``shard_frozen_gather``)."""

from __future__ import annotations

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.validate import validate
from unirl.train import FSDPConfig

GATHER = "++backend.fsdp.gather_for_sampling=true"


def test_a_trainside_recipe_takes_it() -> None:
    _, objs = validate(compose_recipe("diffusion/sd3_tiny_trainside", [GATHER]))
    assert objs["backend.fsdp"].gather_for_sampling is True


def test_an_engine_with_its_own_weights_refuses_it() -> None:
    with pytest.raises(ConfigError) as info:
        validate(compose_recipe("diffusion/sd3_tiny_dedicated_separate", [GATHER]))
    message = str(info.value)
    assert message.startswith("backend.fsdp.gather_for_sampling gathers the trainer's blocks")
    assert "rollout._target_=unirl.rollout.DedicatedEngine samples with its own weights" in message
    assert "\n" not in message


def test_replicate_mode_refuses_it() -> None:
    with pytest.raises(ConfigError, match=r"data_parallel=replicate every rank already holds"):
        FSDPConfig(gather_for_sampling=True, data_parallel="replicate")
