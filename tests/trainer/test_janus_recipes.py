"""The Janus-Pro recipes of ``unirl.train_unified_model``: the checks before Ray refuse a broken
image-token stage in one line; the GPU recipes dry-run (runs: ``tests/e2e/test_janus_tiny.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unirl.config.entry import compose_recipe
from unirl.config.require import ConfigError
from unirl.config.validate import validate
from unirl.trainer.unified_model import check_unified_recipe

TINY = "unified_model/janus_tiny_t2i_r1"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [
                "unified.image.sampling._target_=unirl.types.DiffusionSamplingParams",
                "~unified.image.sampling.temperature",
                "~unified.image.sampling.eval_temperature",
            ],
            "a Janus image stage samples tokens; use unirl.models.janus.ImageTokenSamplingParams",
        ),
        (["unified.image.sampling.samples_per_prompt=2"], "one image per text sample"),
        (["unified.image.sampling.guidance_scale=0.5"], "guidance_scale=0.5 must be >= 1"),
        (
            ["unified.image.algorithm._target_=unirl.algorithms.FlowGRPO"],
            "image tokens train with a token loss: use unirl.algorithms.GRPO",
        ),
        (
            ["pipeline._target_=unirl.models.unified.TransfusionTextPipeline"],
            "is not a JanusTextPipeline",
        ),
        (["bundle.path=nowhere/none", "+bundle.bogus=1"], "bogus"),
        (["+unified.image.sampling.top_k=0"], r"top_k=0 must be -1 \(off\) or >= 1"),
        (["+unified.image.sampling.top_p=1.5"], r"top_p=1.5 must be in \(0, 1\]"),
    ],
)
def test_broken_janus_recipes_are_refused(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    data = compose_recipe(TINY, [f"output_dir={tmp_path / 'run'}", *overrides])
    with pytest.raises(ConfigError, match=message) as info:
        cfg, objs = validate(data)
        check_unified_recipe(cfg, objs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "recipe", ["unified_model/janus_pro_7b_t2i_r1", "unified_model/janus_pro_7b_image_only"]
)
def test_gpu_recipes_dry_run(recipe: str, tmp_path: Path, capsys: Any) -> None:
    from unirl.train_unified_model import run

    data = compose_recipe(recipe, [f"output_dir={tmp_path / 'run'}", "dry_run=true"])
    assert run(data) == 0
    out = capsys.readouterr().out
    assert "unirl.models.janus.pipeline.JanusPipeline" in out
    assert "guidance_scale                     5.0" in out
    only = recipe.endswith("image_only")
    assert ("image tokens only (stack.text.weight: 0)" in out) == only


def test_the_image_stage_request_carries_the_recipes_truncation(tmp_path: Path) -> None:
    """``unified.image.sampling.top_k`` / ``top_p`` reach the image-token request the driver
    authors (train and eval alike); the defaults leave the draw untruncated."""
    from unirl.models.janus.conditions import ImageTokenRequest
    from unirl.train_unified_model import trainer

    def image_request(overrides: list[str], mode: str) -> ImageTokenRequest:
        data = compose_recipe(TINY, [f"output_dir={tmp_path / 'run'}", *overrides])
        driver = trainer(data, dry=True)
        req = driver.build_request(driver.data_source.next_batch(), 0, mode=mode)
        return req.params_for("image", ImageTokenRequest)

    plain = image_request([], "train")
    assert (plain.top_k, plain.top_p) == (-1, 1.0)
    for mode in ("train", "eval"):
        cut = image_request(
            ["+unified.image.sampling.top_k=8", "+unified.image.sampling.top_p=0.9"], mode
        )
        assert (cut.top_k, cut.top_p) == (8, 0.9)
