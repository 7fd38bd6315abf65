"""End to end (slow, UNIRL_SLOW=1) on the GenEval-style quick start (tiny SD3, blob detector):
``rollout.reward_overlap`` gives the same rewards and weights, rollout by rollout, as scoring
at the end of the rollout, with the overlap's metrics logged; the quick start learns and its
lr 1e-9 control stays flat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e_support import read_metrics

from unirl.config.entry import compose_recipe

RECIPE = "diffusion/sd3_tiny_geneval"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("UNIRL_SLOW") != "1",
        reason="slow (UNIRL_SLOW=1): two short and two 50-rollout runs, 12 min on two busy cores",
    ),
]


def _run(out: Path, *extra: str) -> list[dict]:
    from unirl.train_diffusion import run

    data = compose_recipe(
        RECIPE,
        [
            f"output_dir={out}",
            "num_rollouts=3",
            "eval_interval=0",
            "save_interval=0",
            "logging.gallery_interval=0",
            "+rollout.forward_batch_size=4",
            "+bundle.decode_chunk_size=4",
            *extra,
        ],
    )
    assert run(data) == 0
    return read_metrics(out)


def test_reward_overlap_equals_end_of_rollout_scoring(tmp_path: Path, ray_session) -> None:
    plain = _run(tmp_path / "plain")
    overlapped = _run(tmp_path / "overlap", "+rollout.reward_overlap=true")
    for a, b in zip(plain, overlapped, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["reward/std"] == b["reward/std"]
        assert a["train/param_checksum"] == b["train/param_checksum"]
        assert "reward_overlap/hidden_fraction" not in a
        assert 0.0 <= b["reward_overlap/hidden_fraction"] <= 1.0
        assert b["reward_overlap/chunks"] == 4.0  # 16 samples, forward_batch_size 4
        assert b["reward_overlap/latency_s"] > 0.0


def _first_last(rows: list[dict]) -> tuple[float, float]:
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    return first, last


def test_geneval_quick_start_learns_and_the_control_stays_flat(tmp_path: Path, ray_session) -> None:
    from unirl.train_diffusion import run

    common = ["eval_interval=0", "save_interval=0", "logging.gallery_interval=0"]
    assert run(compose_recipe(RECIPE, [f"output_dir={tmp_path / 'learn'}", *common])) == 0
    rows = read_metrics(tmp_path / "learn")
    assert len(rows) == 50 and all("geneval/single_object" in r for r in rows)
    first, last = _first_last(rows)
    assert last > first + 0.25, (first, last)  # measured: see docs/rewards.md
    flat = [f"output_dir={tmp_path / 'flat'}", "backend.optimizer.lr=1e-9", *common]
    assert run(compose_recipe(RECIPE, flat)) == 0
    first, last = _first_last(read_metrics(tmp_path / "flat"))
    assert abs(last - first) < 0.15, (first, last)
