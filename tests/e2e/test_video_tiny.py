"""End to end on the tiny Wan 2.1 text-to-video quick start: a short run writes the video
outputs (metrics with the per-frame reward and the temporal guard, animated GIF galleries of
T frames for rollouts and eval, the LoRA export) and the trained adapter moves."""

from __future__ import annotations

from pathlib import Path

from e2e_support import read_metrics, run_recipe
from PIL import Image

RECIPE = "diffusion/wan21_tiny_t2v"
FRAMES = 5


def gif_frames(path: Path) -> tuple[int, tuple[int, int]]:
    with Image.open(path) as gif:
        return gif.n_frames, gif.size


def test_video_quick_start_writes_gif_galleries_metrics_and_lora(
    tmp_path: Path, ray_session
) -> None:
    out = tmp_path / "video"
    code = run_recipe(
        RECIPE,
        [
            f"output_dir={out}",
            "num_rollouts=4",
            "save_interval=0",
            "eval_interval=4",
            "eval.at_start=false",
            "logging.gallery_interval=2",
        ],
    )
    assert code == 0
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for key in (
        "reward/mean",
        "reward/std",
        "reward/brightness/mean",  # PerFrame(BrightnessTarget): the scorer's name, time-averaged
        "guard/temporal_consistency/mean",
        "time/rollout",
        "time/reward",
        "time/train",
    ):
        assert key in rows[0], key
    for row in rows:
        assert -1.0 <= row["reward/mean"] <= 0.0  # -|brightness - 0.8| of frames in [0, 1]
        assert 0.0 <= row["guard/temporal_consistency/mean"] <= 1.0
        assert row["train/ratio/min"] == 1.0 == row["train/ratio/max"]  # on-policy first update
    assert rows[0]["train/param_checksum"] != rows[-1]["train/param_checksum"]  # it trained
    sheets = sorted((out / "samples").iterdir())
    assert [p.name for p in sheets] == ["rollout_000000.gif", "rollout_000002.gif"]
    for sheet in sheets:
        frames, size = gif_frames(sheet)
        assert frames == FRAMES and size[0] > 0
    assert [r["step"] for r in read_metrics(out, "eval_metrics.jsonl")] == [4]
    eval_frames, _ = gif_frames(out / "eval" / "step_000004.gif")
    assert eval_frames == FRAMES
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (out / "lora" / "adapter_config.json").is_file()
    assert not (out / "lora" / "transformer").exists()  # one expert: no per-expert folders
