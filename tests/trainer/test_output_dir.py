"""A fresh run never lands on an earlier run silently: refused before Ray unless ``resume``
or ``overwrite=true``; ``overwrite`` clears what the earlier run left."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.validate import validate
from unirl.trainer.output import OutputDir


def _validate(out: Path, *extra: str) -> None:
    validate(compose_recipe("diffusion/sd3_tiny_trainside", [f"output_dir={out}", *extra]))


def test_fresh_run_into_a_run_folder_is_refused_unless_resume_or_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _validate(out)  # a new folder
    (out / "checkpoints").mkdir(parents=True)
    _validate(out)  # an empty checkpoints/ holds nothing
    (out / "checkpoints" / "step_000004").mkdir()
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints\); pass resume=auto"):
        _validate(out)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ConfigError, match=r"\(metrics.jsonl, checkpoints\)"):
        _validate(out)
    _validate(out, "resume=auto")
    _validate(out, "overwrite=true")


def test_clear_run_removes_what_an_earlier_run_left(tmp_path: Path) -> None:
    out = OutputDir(tmp_path / "run")
    for folder in ("checkpoints/step_000004", "samples", "lora", "eval"):
        (out.root / folder).mkdir(parents=True)
    for name in ("metrics.jsonl", "metrics.csv", "eval_metrics.jsonl", "config.yaml"):
        (out.root / name).write_text("x")
    removed = out.clear_run()
    assert sorted(removed) == sorted(
        [
            "checkpoints/",
            "samples/",
            "eval/",
            "lora/",
            "metrics.jsonl",
            "metrics.csv",
            "eval_metrics.jsonl",
        ]
    )
    assert sorted(p.name for p in out.root.iterdir()) == ["config.yaml"]
