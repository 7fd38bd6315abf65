"""End to end (slow, UNIRL_SLOW=1): the REINFORCE++ and DAPO text quick starts raise the
reward through Ray, and DAPO's dynamic sampling never hands a zero-variance group to
training (every rollout's advantage/zero_std_ratio is 0, with refill rounds taken)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e_support import read_metrics

from unirl.config.entry import compose_recipe

QUIET = ["save_interval=0", "eval_interval=0", "logging.gallery_interval=0"]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("UNIRL_SLOW") != "1", reason="slow (UNIRL_SLOW=1): ~1.5 min per run"
    ),
]


def _run(recipe: str, overrides: list[str]) -> int:
    from unirl.train_vlm import run

    return run(compose_recipe(recipe, overrides))


def _first_last(rows: list[dict]) -> tuple[float, float]:
    return (
        sum(r["reward/mean"] for r in rows[:5]) / 5,
        sum(r["reward/mean"] for r in rows[-5:]) / 5,
    )


def test_reinforcepp_quick_start_learns(tmp_path: Path, ray_session) -> None:
    out = tmp_path / "rpp"
    assert _run("llm/qwen3_tiny_reinforcepp", [f"output_dir={out}", *QUIET]) == 0
    rows = read_metrics(out)
    first, last = _first_last(rows)
    assert last > first + 0.2, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"
    assert rows[-1]["kl/rollout_mean"] > 0.0  # the KL to the base entered the reward


def test_dapo_quick_start_learns_and_trains_no_zero_variance_group(
    tmp_path: Path, ray_session
) -> None:
    out = tmp_path / "dapo"
    assert _run("llm/qwen3_tiny_dapo", [f"output_dir={out}", *QUIET]) == 0
    rows = read_metrics(out)
    assert len(rows) == 40
    first, last = _first_last(rows)
    assert last > first + 0.5, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"
    assert all(r["advantage/zero_std_ratio"] == 0.0 for r in rows)
    assert sum(r["dynamic_sampling/rounds"] for r in rows) > 0  # refills happened
    assert all(r["dynamic_sampling/dropped_groups"] >= 0 for r in rows)
