"""TrainStack takes its knobs as one TrainStackConfig (the recipe's ``stack:`` keys)."""

from __future__ import annotations

import pytest
from test_train_stack_nonfinite import ScriptedLoss
from train_fakes import TinyBundle, empty_track, make_backend

from unirl.config import ConfigError
from unirl.train import TrainStack, TrainStackConfig


class OneUpdateLoss(ScriptedLoss):
    supports_multi_update = False


def test_knobs_become_one_config_the_stack_reads() -> None:
    backend = make_backend(bundle=TinyBundle())
    stack = TrainStack(
        backend=backend, algorithm=ScriptedLoss([1.0, 2.0]), micro_batch_size=1, shuffle=False
    )
    assert stack.config == TrainStackConfig(micro_batch_size=1, shuffle=False)
    steps = stack.train_track(empty_track(2), 0)["steps"]
    assert len(steps) == stack.config.num_updates_per_batch == 1


def test_bad_knobs_fail_in_the_config() -> None:
    backend = make_backend(bundle=TinyBundle())
    with pytest.raises(ConfigError, match=r"stack\.micro_batch_size must be >= 1"):
        TrainStack(backend=backend, algorithm=ScriptedLoss([]), micro_batch_size=0)
    with pytest.raises(TypeError, match="micro_batchsize"):
        TrainStack(backend=backend, algorithm=ScriptedLoss([]), micro_batchsize=2)
    with pytest.raises(ConfigError, match="does not support several updates per rollout"):
        TrainStack(backend=backend, algorithm=OneUpdateLoss([]), num_updates_per_batch=2)
