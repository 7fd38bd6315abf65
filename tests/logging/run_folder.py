"""A run folder as the trainer leaves it, for the curve and report tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_run(root: Path, *, rollouts: int = 6, components: bool = True) -> None:
    """A run folder as the trainer leaves it: train rows, evals at 0, 3 and 6, a config."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "metrics.jsonl").open("w") as f:
        for step in range(rollouts):
            row = {
                "step": step,
                "reward/mean": -0.4 + 0.03125 * step,
                "reward/std": 0.05,
                "train/loss": 0.01 * (step + 1),
                "train/approx_kl": 1e-4,
                "train/grad_norm": 0.25,
                "time/total": 0.5,
            }
            if components:
                row |= {
                    "reward/brightness/mean": -0.4 + 0.03125 * step,
                    "reward/brightness/std": 0.05,
                    "reward/stats/edge/mean": 7.0,  # a guard's statistic, not a component
                }
            f.write(json.dumps(row) + "\n")
    with (root / "eval_metrics.jsonl").open("w") as f:
        for step in (0, 3, 6):
            f.write(json.dumps({"step": step, "eval/reward/mean": -0.4 + 0.02 * step}) + "\n")
    (root / "config.yaml").write_text("num_rollouts: 6\nseed: 7\n")
