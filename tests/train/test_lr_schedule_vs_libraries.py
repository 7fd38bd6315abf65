"""Why ``LRScheduleConfig`` is not a call to ``transformers.get_scheduler`` /
``diffusers.optimization.get_scheduler``: only ``constant`` gives the same lr sequence. Their
warm-up trains its first step at lr 0 (``s / warmup``; ours ``(s + 1) / warmup``) and their
cosine rises again after ``num_training_steps`` (ours holds the floor). A swap would change
every warm-up run's lr sequence, so these tests pin the difference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from unirl.train.optim import LRScheduleConfig, build_lr_scheduler


def _lrs(scheduler: Any, steps: int = 12) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def _library(name: str) -> Any:
    if name == "transformers":
        import transformers

        return transformers.get_scheduler
    import diffusers.optimization

    return diffusers.optimization.get_scheduler


@pytest.mark.parametrize("library", ["transformers", "diffusers"])
def test_constant_is_the_same_sequence(library: str) -> None:
    ours = _lrs(build_lr_scheduler(_optimizer(), LRScheduleConfig(kind="constant")))
    assert ours == _lrs(_library(library)("constant", _optimizer())) == [1.0] * 12


@pytest.mark.parametrize("library", ["transformers", "diffusers"])
def test_library_warmup_starts_at_zero_ours_one_step_later(library: str) -> None:
    ours = _lrs(
        build_lr_scheduler(_optimizer(), LRScheduleConfig(kind="warmup_constant", warmup_steps=4))
    )
    theirs = _lrs(_library(library)("constant_with_warmup", _optimizer(), num_warmup_steps=4))
    assert ours[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert theirs[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_library_cosine_rises_again_past_its_end_ours_holds_the_floor() -> None:
    from transformers import get_scheduler

    cfg = LRScheduleConfig(kind="cosine", warmup_steps=2, total_steps=8, min_lr_ratio=0.1)
    ours = _lrs(build_lr_scheduler(_optimizer(), cfg))
    theirs = _lrs(
        get_scheduler(
            "cosine_with_min_lr",
            _optimizer(),
            num_warmup_steps=2,
            num_training_steps=8,
            scheduler_specific_kwargs={"min_lr_rate": 0.1},
        )
    )
    assert ours[0] == 0.5 and theirs[0] == 0.0
    assert ours[2:9] == pytest.approx(theirs[2:9])  # the same cosine in between
    assert ours[9:] == pytest.approx([0.1] * 3) and theirs[11] > 0.5
