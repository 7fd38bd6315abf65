"""A resume whose recipe changes what the checkpoint was made for (model family, LoRA shape,
algorithm) is refused on the driver from the recipe recorded in ``driver_state.json``, before
any Ray work or model build; a changed lr is not refused (it is applied:
tests/train/test_resume_hyperparameters.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.trainer import base as trainer_base
from unirl.trainer.diffusion import DiffusionTrainer
from unirl.trainer.output import DRIVER_STATE, incompatible_resume

RECIPE = "diffusion/sd3_tiny_trainside"


def _recipe(tmp_path: Path, *overrides: str) -> dict[str, Any]:
    return compose_recipe(RECIPE, [f"output_dir={tmp_path / 'run'}", *overrides])


def test_same_recipe_or_a_new_lr_resumes(tmp_path: Path) -> None:
    recorded = _recipe(tmp_path)
    step = tmp_path / "step_000004"
    assert incompatible_resume(recorded, step, recorded) is None
    assert (
        incompatible_resume(_recipe(tmp_path, "backend.optimizer.lr=1e-5"), step, recorded) is None
    )
    assert incompatible_resume(_recipe(tmp_path), step, None) is None  # nothing recorded


@pytest.mark.parametrize(
    ("overrides", "changed"),
    [
        (
            ["bundle._target_=unirl.models.qwen_image.QwenImageBundle"],
            "bundle._target_: unirl.models.sd3.SD3Bundle -> unirl.models.qwen_image.QwenImageBundle",
        ),
        (["backend.lora.rank=4"], "backend.lora.rank: 8 -> 4"),
        (
            ["algorithm._target_=unirl.algorithms.FlowDPPO"],
            "algorithm._target_: unirl.algorithms.FlowGRPO -> unirl.algorithms.FlowDPPO",
        ),
        (["backend.lora=null"], "backend.lora: adapter -> full fine-tune"),
    ],
    ids=["family", "lora_rank", "algorithm", "lora_to_full"],
)
def test_an_incompatible_change_is_named(
    tmp_path: Path, overrides: list[str], changed: str
) -> None:
    recorded = _recipe(tmp_path)
    line = incompatible_resume(_recipe(tmp_path, *overrides), tmp_path / "step_000004", recorded)
    assert line is not None and line.startswith(
        "resume: checkpoint step_000004 cannot be loaded by this recipe ("
    )
    assert changed in line
    assert line.endswith(
        "a checkpoint resumes the same model family, LoRA shape and algorithm; set them back, "
        "or start a fresh run (another output_dir, or overwrite=true)"
    )


def test_a_family_change_is_refused_before_ray(tmp_path: Path, monkeypatch) -> None:
    """The trainer's run: the refusal comes after resume resolution and before the DevicePool
    (Ray) or any model exists."""
    recorded = _recipe(tmp_path)
    step = tmp_path / "run" / "checkpoints" / "step_000004"
    step.mkdir(parents=True)
    (step / DRIVER_STATE).write_text(json.dumps({"next_rollout": 4, "config": recorded}))
    now = copy.deepcopy(_recipe(tmp_path, f"resume={step}"))
    now["bundle"]["_target_"] = "unirl.models.qwen_image.QwenImageBundle"

    def no_ray(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the DevicePool (Ray) was started")

    monkeypatch.setattr(trainer_base, "resolve_resume", lambda cfg, out: step)
    monkeypatch.setattr(trainer_base, "DevicePool", no_ray)
    from unirl.config.run import RunConfig

    trainer = DiffusionTrainer(RunConfig.from_dict(now), now)
    with pytest.raises(ConfigError) as info:
        trainer.run()
    assert str(info.value).startswith(
        "resume: checkpoint step_000004 cannot be loaded by this recipe (bundle._target_: "
        "unirl.models.sd3.SD3Bundle -> unirl.models.qwen_image.QwenImageBundle)"
    )
