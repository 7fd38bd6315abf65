"""End to end on the tiny Qwen3: the text quick-start runs through Ray, writes its outputs and
its reward rises (format first: a tiny random model learns to close a box around a number)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from e2e_support import read_metrics

from unirl.config.entry import compose_recipe

RECIPE = "llm/qwen3_tiny_grpo"


def test_text_quick_start_learns_and_writes_outputs(tmp_path: Path, ray_session) -> None:
    from unirl.train_vlm import run

    out = tmp_path / "llm"
    data = compose_recipe(
        RECIPE,
        [
            f"output_dir={out}",
            "num_rollouts=20",
            "save_interval=20",
            "eval_interval=20",
            "logging.gallery_interval=10",
        ],
    )
    assert run(data) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(20))
    for key in (
        "reward/mean",
        "reward/std",
        "reward/answer/mean",
        "reward/format/mean",
        "response_length/mean",
        "response_length/max",
        "response/clip_ratio",
        "rollout/logp_gap",
        "time/generate",
        "time/reward",
        "time/train",
        "train/loss",
        "train/micro_batches",
    ):
        assert key in rows[0], key
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert 0.0 <= row["rollout/logp_gap"] < 1e-5  # trainside fp32: sampler == replay
        assert 1 <= row["response_length/mean"] <= 6
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    assert last > first + 0.03, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"
    samples = sorted(p.name for p in (out / "samples").glob("*.jsonl"))
    assert samples == ["rollout_000000.jsonl", "rollout_000010.jsonl"]
    line = json.loads((out / "samples" / "rollout_000010.jsonl").read_text().splitlines()[0])
    assert line["completion"].startswith("\\boxed{") and line["answer"] is not None
    evals = read_metrics(out, "eval_metrics.jsonl")
    assert evals[-1]["step"] == 20 and "eval/reward/mean" in evals[-1]
    assert (out / "eval" / "step_000020.jsonl").is_file()
    assert (out / "checkpoints" / "step_000020" / "driver_state.json").is_file()


def test_vision_language_quick_start_learns(tmp_path: Path, ray_session) -> None:
    """The tiny Qwen2.5-VL on the geometry multiple-choice set: diagrams reach the model
    (one image per prompt), the box closes around an option letter, the reward rises."""
    from unirl.train_vlm import run

    out = tmp_path / "vlm"
    data = compose_recipe(
        "vlm/qwen_vl_tiny_grpo",
        [f"output_dir={out}", "num_rollouts=20", "eval_interval=0", "logging.gallery_interval=0"],
    )
    assert run(data) == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(20))
    assert all(0.0 <= r["rollout/logp_gap"] < 1e-5 for r in rows)
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    assert last > first + 0.03, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"
