"""End to end on the tiny preset: the Flow-DPPO and DiffusionNFT quick starts raise the reward,
Flow-DPPO's first update is on-policy, and an NFT run resumes exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

from e2e_support import read_metrics, run_recipe

QUIET = ["save_interval=0", "eval_interval=0", "logging.gallery_interval=0"]


def _rise(rows: list[dict]) -> tuple[float, float]:
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    return first, last


def test_flowdppo_quick_start_reward_rises_and_the_mask_acts(tmp_path: Path, ray_session) -> None:
    out = tmp_path / "dppo"
    assert (
        run_recipe("diffusion/sd3_tiny_flowdppo", [f"output_dir={out}", "num_rollouts=20", *QUIET])
        == 0
    )
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(20))
    first, last = _rise(rows)
    assert last > first + 0.05, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"
    for key in (
        "train/dppo_kl/max",
        "train/mask/dropped",
        "train/mask/over_threshold",
        "train/ratio/mean",
    ):
        assert key in rows[0], key
    # two optimizer steps per rollout: the second one moves D past kl_threshold on some rollouts
    assert any(r["train/mask/dropped"] > 0 for r in rows)
    assert max(r["train/dppo_kl/max"] for r in rows) > 0.0


def test_flowdppo_first_update_has_ratio_one_and_zero_kl(tmp_path: Path, ray_session) -> None:
    out = tmp_path / "dppo_first"
    code = run_recipe(
        "diffusion/sd3_tiny_flowdppo",
        [f"output_dir={out}", "num_rollouts=3", "stack.num_updates_per_batch=1", *QUIET],
    )
    assert code == 0
    rows = read_metrics(out)
    assert len(rows) == 3
    for r in rows:  # one update per rollout, so every logged update is a rollout's first
        assert r["train/ratio/min"] == 1.0 == r["train/ratio/max"], r["step"]
        assert r["train/dppo_kl/max"] == 0.0, r["step"]
        assert r["train/mask/dropped"] == 0.0
    assert rows[0]["train/param_checksum"] != rows[2]["train/param_checksum"]  # it trained


def test_nft_quick_start_reward_rises(tmp_path: Path, ray_session) -> None:
    out = tmp_path / "nft"
    assert (
        run_recipe("diffusion/sd3_tiny_nft", [f"output_dir={out}", "num_rollouts=20", *QUIET]) == 0
    )
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(20))
    first, last = _rise(rows)
    assert last > first + 0.05, f"reward did not rise: first five {first:.4f}, last five {last:.4f}"
    for key in (
        "train/nft/positive_loss",
        "train/nft/negative_loss",
        "train/nft/weight_pos/mean",
        "train/nft/weight_neg/min",
        "train/nft/weight_clamped",
        "train/policy_loss",
    ):
        assert key in rows[0], key
    assert all(r["nft/old_decay"] == 0.0 for r in rows)  # ema kind copy
    assert "train/ratio/mean" not in rows[0]  # likelihood-free: no SDE steps, no ratios


def test_nft_resume_is_exact(tmp_path: Path, ray_session) -> None:
    ref = tmp_path / "ref"
    common = [
        "num_rollouts=3",
        "save_interval=2",
        "eval_interval=0",
        "logging.gallery_interval=0",
        "algorithm.ema.kind=linear",
        "algorithm.ema.end=0.5",
        "algorithm.ema.ramp_rollouts=2",
    ]
    assert run_recipe("diffusion/sd3_tiny_nft", [f"output_dir={ref}", *common]) == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(ref, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000003")
    shutil.rmtree(resumed / "lora")
    assert (
        run_recipe("diffusion/sd3_tiny_nft", [f"output_dir={resumed}", "resume=auto", *common]) == 0
    )
    a, b = read_metrics(ref), read_metrics(resumed)
    assert [r["step"] for r in b] == [0, 1, 2]
    for step in (2,):  # the old adapter and the training noise come back exactly
        for key in (
            "reward/mean",
            "train/loss",
            "train/grad_norm",
            "train/param_checksum",
            "train/nft/weight_pos/mean",
            "nft/old_decay",
        ):
            assert a[step][key] == b[step][key], (step, key, a[step][key], b[step][key])
    assert [r["nft/old_decay"] for r in a] == [0.0, 0.25, 0.5]
