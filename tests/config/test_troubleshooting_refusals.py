"""docs/troubleshooting.md quotes the refusals and warnings of issue #30 as the code prints
them (the wrong entrypoint through the real CLI: exit 2, before Ray, dry run too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.run import RunConfig
from unirl.trainer.base import degenerate_sampling_warnings
from unirl.trainer.output import incompatible_resume

PAGE = (Path(__file__).parents[2] / "docs" / "troubleshooting.md").read_text()


def _refusal(entry: str, recipe: str, *overrides: str) -> str:
    import importlib

    with pytest.raises(ConfigError) as info:
        importlib.import_module(entry).check(compose_recipe(recipe, list(overrides)))
    return f"[unirl] configuration error: {info.value}"


def test_wrong_entrypoint_line_as_the_cli_prints_it(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "unirl.train_vlm",
            "--config-name=diffusion/sd3_tiny_trainside",
            "dry_run=true",
            f"output_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ""},
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert "ray" not in out.stderr.lower().replace("unirl.train_", "")
    lines = out.stderr.splitlines()
    assert len(lines) == 1
    assert f"{lines[0]}\n" in PAGE


def test_refusals_and_warnings_are_quoted(tmp_path: Path) -> None:
    out = f"output_dir={tmp_path / 'run'}"
    video = _refusal(
        "unirl.train_diffusion",
        "diffusion/wan21_tiny_t2v",
        out,
        "~reward.backend",
        "+reward.backend={_target_: unirl.reward.local.BrightnessTarget, target: 0.8}",
    )
    weights = _refusal(
        "unirl.train_diffusion",
        "diffusion/sd3_tiny_trainside",
        out,
        "advantage.component_weights={brightnes:1.0}",
    )
    recorded = compose_recipe("diffusion/sd3_tiny_trainside", [out])
    changed = compose_recipe(
        "diffusion/sd3_tiny_trainside",
        [out, "bundle._target_=unirl.models.qwen_image.QwenImageBundle"],
    )
    resume = incompatible_resume(changed, tmp_path / "step_000004", recorded)
    greedy = degenerate_sampling_warnings(
        RunConfig.from_dict(compose_recipe("llm/qwen3_tiny_grpo", ["sampling.temperature=0"]))
    )
    for line in (video, weights, f"[unirl] configuration error: {resume}", *greedy):
        assert f"{line}\n" in PAGE, line
