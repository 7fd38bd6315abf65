"""Resume applies what it announces: a changed ``backend.optimizer.lr`` reaches the optimizer's
param groups, the schedule and the lr the stack logs; the optimizer's moments and the
schedule's position stay the checkpoint's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_fakes import make_backend, train_step, transformer_inputs

from unirl.train import LRScheduleConfig

SCHEDULE = LRScheduleConfig(kind="cosine", warmup_steps=1, total_steps=10)


def _moments(backend) -> list[torch.Tensor]:
    return [
        t.clone()
        for p in backend.trainable_parameters()
        for t in (backend.optimizer.state[p]["exp_avg"], backend.optimizer.state[p]["exp_avg_sq"])
    ]


@pytest.mark.parametrize("schedule", [None, SCHEDULE], ids=["constant", "cosine"])
def test_resumed_optimizer_uses_the_new_lr(tmp_path: Path, schedule) -> None:
    kwargs = {"lr_schedule": schedule} if schedule is not None else {}
    src = make_backend(lr=3e-3, **kwargs)
    for step in range(3):
        train_step(src, transformer_inputs(2, seed=step))
    src.save_checkpoint(tmp_path / "step_3")
    factor = src.lr / 3e-3  # the schedule's factor at step 3 (1 for the constant one)

    dst = make_backend(lr=1e-3, seed=5, **kwargs)
    dst.load_checkpoint(tmp_path / "step_3")
    # the moments are the checkpoint's, the lr is the recipe's (times the same factor)
    assert all(torch.equal(a, b) for a, b in zip(_moments(src), _moments(dst), strict=True))
    assert dst.step == 3
    assert [g["lr"] for g in dst.optimizer.param_groups] == pytest.approx([1e-3 * factor])
    assert [g["initial_lr"] for g in dst.optimizer.param_groups] == [1e-3]
    assert dst.scheduler.base_lrs == [1e-3]
    assert dst.lr == pytest.approx(1e-3 * factor)  # what TrainStack logs as train/lr
    assert dst.scheduler.get_last_lr() == pytest.approx([1e-3 * factor])

    # the next step moves the weights by the new lr: compare with the old lr's step
    before = {n: p.detach().clone() for n, p in dst.named_trainable_parameters()}
    train_step(dst, transformer_inputs(2, seed=3))
    train_step(src, transformer_inputs(2, seed=3))
    step_new = sum(
        (p.detach() - before[n]).abs().sum() for n, p in dst.named_trainable_parameters()
    )
    assert float(step_new) > 0
    # the schedule goes on from the restored position, on the new base lr
    assert dst.lr == pytest.approx(src.lr / 3)


def test_resume_with_the_same_lr_is_unchanged(tmp_path: Path) -> None:
    src = make_backend(lr=3e-3, lr_schedule=SCHEDULE)
    for step in range(2):
        train_step(src, transformer_inputs(2, seed=step))
    src.save_checkpoint(tmp_path / "step_2")
    dst = make_backend(lr=3e-3, seed=5, lr_schedule=SCHEDULE)
    dst.load_checkpoint(tmp_path / "step_2")
    assert dst.lr == src.lr
    assert dst.scheduler.state_dict() == src.scheduler.state_dict()
