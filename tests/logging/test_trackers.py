"""Trackers: local files always (jsonl + csv with late columns, resume truncation), TensorBoard
event files when asked, a clear error for a missing optional tracker; contact sheets."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from unirl.logging import LocalTracker, build_trackers, contact_sheet


def test_local_tracker_writes_jsonl_and_csv_with_late_columns(tmp_path: Path) -> None:
    t = LocalTracker(tmp_path)
    t.log(0, {"reward/mean": 0.5})
    t.log(1, {"reward/mean": 0.75, "kl_loss": 0.1, "bad": float("nan")})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 0, "reward/mean": 0.5},
        {"step": 1, "reward/mean": 0.75, "kl_loss": 0.1, "bad": None},
    ]
    with (tmp_path / "metrics.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["step", "reward/mean", "kl_loss", "bad"]
    assert table[0]["kl_loss"] == "" and table[1]["kl_loss"] == "0.1"
    resumed = LocalTracker(tmp_path)  # a resumed run drops what the killed run logged later
    resumed.truncate_after(0)
    assert [
        json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [0]


def test_tensorboard_tracker_writes_events(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra")
    trackers = build_trackers(["local", "tensorboard"], tmp_path, config={})
    trackers.log(3, {"reward/mean": 1.25})
    trackers.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    (scalar,) = acc.Scalars("reward/mean")
    assert scalar.step == 3 and scalar.value == 1.25


def test_contact_sheet_grid(tmp_path: Path) -> None:
    pixels = torch.zeros(3, 3, 8, 8)
    pixels[1] = 1.0
    path = contact_sheet(
        pixels, ["0.1 | a", "0.2 | b", "0.3 | c"], tmp_path / "s.png", columns=2, tile=32
    )
    img = Image.open(path)
    assert img.size == (64, 2 * (32 + 3 * 12 + 6))
    assert img.getpixel((40, 10)) == (255, 255, 255) and img.getpixel((5, 5)) == (0, 0, 0)
    with pytest.raises(ValueError, match="3 samples but 2 captions"):
        contact_sheet(pixels, ["a", "b"], tmp_path / "x.png")


def test_missing_optional_tracker_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match=r"pip install 'unirl-mm\[wandb\]'"):
        build_trackers(["local", "wandb"], tmp_path, config={})


def test_edit_sheet_puts_the_source_left_of_the_result(tmp_path: Path) -> None:
    from unirl.logging import edit_sheet

    sources = torch.zeros(2, 3, 8, 8)  # black
    results = torch.ones(2, 3, 8, 8)  # white
    results[:, 1:] = 0.0  # red
    img = Image.open(edit_sheet(sources, results, ["a", "b"], tmp_path / "e.png", tile=16))
    assert img.size == (2 * (2 * 16 + 2), 16 + 3 * 12 + 6)
    assert img.getpixel((5, 5)) == (0, 0, 0)  # source of sample 0
    assert img.getpixel((16, 5)) == (255, 255, 255)  # the gap
    assert img.getpixel((25, 5)) == (255, 0, 0)  # result of sample 0
    assert img.getpixel((34 + 25, 5)) == (255, 0, 0)  # result of sample 1
    with pytest.raises(ValueError, match="differ"):
        edit_sheet(sources[:, :, :4], results, ["a", "b"], tmp_path / "x.png")


def test_video_sheet_is_an_animated_gif_with_one_sheet_per_frame(tmp_path: Path) -> None:
    from unirl.logging import video_sheet

    frames = torch.zeros(2, 3, 3, 8, 8)
    for t in range(3):
        frames[:, t, t] = 1.0  # frame 0 red, 1 green, 2 blue
    path = video_sheet(frames, ["a", "b"], tmp_path / "v.gif", fps=8, tile=16)
    img = Image.open(path)
    assert img.n_frames == 3 and img.info["duration"] == 130 and img.info["loop"] == 0
    seen = []
    for t in range(3):
        img.seek(t)
        seen.append(img.convert("RGB").getpixel((5, 5)))
    assert seen == [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    with pytest.raises(ValueError, match=r"\[N, T, 3, H, W\]"):
        video_sheet(frames[0], ["a"], tmp_path / "x.gif")


def test_external_trackers_get_eval_metrics_and_sheets_as_they_are(tmp_path: Path) -> None:
    """``log_external`` skips the local tracker; TensorBoard gets the PNG through
    ``add_image`` (pixels unchanged) and a GIF's frames side by side through ``add_images``."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from unirl.logging import video_sheet

    png = contact_sheet(torch.rand(2, 3, 8, 8), ["a", "b"], tmp_path / "s.png", tile=16)
    gif = video_sheet(torch.rand(1, 3, 3, 8, 8), ["v"], tmp_path / "v.gif", tile=16)
    trackers = build_trackers(["local", "tensorboard"], tmp_path / "run", config={})
    trackers.log_external(4, {"eval/reward/mean": 0.5}, media={"eval/png": png, "eval/gif": gif})
    trackers.close()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # eval has its own local file
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("eval/reward/mean")] == [(4, 0.5)]
    (image,) = events.Images("eval/png")
    shown = Image.open(io.BytesIO(image.encoded_image_string)).convert("RGB")
    assert image.step == 4 and shown.tobytes() == Image.open(png).convert("RGB").tobytes()
    (frames,) = events.Images("eval/gif")
    width, height = Image.open(gif).size
    assert frames.step == 4 and (frames.width, frames.height) == (3 * width, height)
