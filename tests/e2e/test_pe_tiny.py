"""End to end on the tiny prompt enhancer: the tiny Qwen3 rewrites prompts for the tiny SD3
through Ray, the run writes its outputs and every number is finite; with UNIRL_SLOW=1 also
that the image reward rises (the policy learns rewrites that make the frozen drawer draw
brighter images: first five -0.355, last five -0.332 at 20 rollouts); with the drawer trained
too, both stacks train and checkpoint."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from e2e_support import read_metrics

from unirl.config.entry import compose_recipe

REPO = Path(__file__).resolve().parents[2]


def _quick_start(out: Path, rollouts: int, gallery_every: int) -> list[dict[str, Any]]:
    from unirl.train_pe import run

    data = compose_recipe(
        "pe/pe_tiny_trainside",
        [
            f"output_dir={out}",
            f"num_rollouts={rollouts}",
            f"eval_interval={rollouts}",
            f"logging.gallery_interval={gallery_every}",
            "logging.progress=off",
        ],
    )
    assert run(data) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(rollouts))
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert 0.0 <= row["pe/rollout/logp_gap"] < 1e-5  # trainside fp32: sampler == replay
        # mean over 2 images per rewrite, none dropped: the mean of the rewrites' rewards is
        # the mean of the images'
        assert row["pe/reward/mean"] == pytest.approx(row["reward/mean"], abs=1e-6)
    return rows


def test_pe_quick_start_writes_its_outputs(tmp_path: Path, ray_session) -> None:
    out = tmp_path / "pe"
    rows = _quick_start(out, rollouts=6, gallery_every=5)
    for key in (
        "reward/mean",
        "pe/reward/mean",
        "pe/train/loss",
        "pe/advantage/std",
        "pe/response_length/mean",
        "pe/empty_rewrites",
        "pe/rewrite_chars/mean",
        "time/pe/generate",
        "time/diffusion/rollout",
    ):
        assert key in rows[0], key
    assert "train/loss" not in rows[0]  # the drawer is frozen
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "rollout_000000.jsonl",
        "rollout_000000.png",
        "rollout_000005.jsonl",
        "rollout_000005.png",
    ]
    lines = [
        json.loads(x) for x in (out / "samples" / "rollout_000005.jsonl").read_text().splitlines()
    ]
    assert len(lines) == 16
    prompts = set((REPO / "datasets" / "tiny" / "prompts.txt").read_text().splitlines())
    for a, b in zip(lines[::2], lines[1::2], strict=True):  # the 2 images of one rewrite
        assert a["parent_id"] == b["parent_id"] and a["rewrite"] == b["rewrite"]
        assert a["prompt"] in prompts and a["rewrite"]
    evals = read_metrics(out, "eval_metrics.jsonl")
    assert [e["step"] for e in evals] == [0, 6]
    assert all(math.isfinite(e["eval/reward/mean"]) for e in evals)
    assert (out / "eval" / "step_000006.png").is_file()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("UNIRL_SLOW") != "1",
    reason="slow (UNIRL_SLOW=1): 20 rollouts through Ray, ~60 s on two CPU cores",
)
def test_pe_quick_start_learns(tmp_path: Path, ray_session) -> None:
    rows = _quick_start(tmp_path / "learn", rollouts=20, gallery_every=0)
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    assert last > first + 0.01, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"


def test_train_both_trains_two_stacks_and_checkpoints_each(tmp_path: Path, ray_session) -> None:
    """``pe.train_both``: both stages train (the drawer's single update replays at the
    sampling weights, ratio exactly 1); the checkpoint holds one verified sub-folder per
    stage and only the drawer exports a LoRA."""
    from unirl.train_pe import run
    from unirl.trainer.output import checkpoint_problem

    out = tmp_path / "both"
    data = compose_recipe(
        "pe/pe_tiny_train_both",
        [
            f"output_dir={out}",
            "num_rollouts=2",
            "save_interval=2",
            "eval_interval=0",
            "logging.gallery_interval=0",
            "logging.progress=off",
        ],
    )
    assert run(data) == 0
    rows = read_metrics(out)
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert row["train/ratio/min"] == 1.0 and row["train/ratio/max"] == 1.0
        assert "pe/train/loss" in row and "advantage/std" in row
    step = out / "checkpoints" / "step_000002"
    assert {"diffusion", "pe"} <= {p.name for p in step.iterdir() if p.is_dir()}
    assert checkpoint_problem(step) is None
    assert sorted(p.name for p in (out / "lora").iterdir()) == ["diffusion"]
