"""Curves drawn with Pillow, the report page on disk, and the never-fatal refresh."""

from __future__ import annotations

import json
import os

from PIL import Image
from run_folder import write_run

from unirl.logging.curves import draw_curves
from unirl.logging.plot import PALETTE, Series, line_chart, nice_ticks, tick_label
from unirl.logging.report import (
    REPORT,
    format_value,
    latest_sheets,
    refresh_run_views,
    render_report,
)


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(-0.3436, -0.238) == [-0.35, -0.325, -0.3, -0.275, -0.25, -0.225]
    assert nice_ticks(0, 39, 8) == [0, 10, 20, 30, 40]
    assert nice_ticks(5, 5) == [4.4, 4.6, 4.8, 5.0, 5.2, 5.4, 5.6]
    assert [tick_label(t, 0.025) for t in (-0.35, -0.325)] == ["-0.350", "-0.325"]
    assert tick_label(1250, 250) == "1250" and tick_label(2.5e-05, 5e-6) == "2.5e-05"


def test_a_point_lands_where_the_axes_say():
    """y 0..1 and x 0..10 get exactly those end ticks, so (5, 0.5) is the plot's centre."""
    image = line_chart(
        [Series(label="a", xs=[0, 10], ys=[0, 1], color=PALETTE[0])],
        title="t",
        xlabel="x",
        ylabel="y",
        size=(900, 420),
    )
    left, right, top, bottom = 78, 900 - 20, 40, 420 - 56
    centre = ((left + right) // 2, (top + bottom) // 2)
    assert image.getpixel(centre) == _rgb(PALETTE[0])
    assert image.getpixel((left, (top + bottom) // 2)) == (0, 0, 0)  # the frame


def test_draw_curves_writes_each_chart(tmp_path):
    write_run(tmp_path)
    written = draw_curves(tmp_path)
    assert [p.name for p in written] == ["reward.png", "components.png", "train.png"]
    sizes = {p.name: Image.open(p).size for p in written}
    assert sizes == {
        "reward.png": (900, 420),
        "components.png": (900, 420),
        "train.png": (900, 900),  # loss, approx KL, grad norm
    }
    reward = Image.open(tmp_path / "curves" / "reward.png").convert("RGB")
    colors = {c for _, c in reward.getcolors(1 << 20)}
    assert _rgb(PALETTE[0]) in colors and _rgb(PALETTE[1]) in colors  # train line, eval dots
    assert not any(p.name.startswith(".") for p in (tmp_path / "curves").iterdir())


def test_no_components_no_components_chart(tmp_path):
    write_run(tmp_path, components=False)
    (tmp_path / "curves").mkdir()
    (tmp_path / "curves" / "components.png").write_bytes(b"stale")
    assert [p.name for p in draw_curves(tmp_path)] == ["reward.png", "train.png"]
    assert not (tmp_path / "curves" / "components.png").exists()


def test_curves_of_an_empty_run_say_no_data(tmp_path):
    assert [p.name for p in draw_curves(tmp_path)] == ["reward.png"]


def test_report_is_owner_only_and_names_the_latest_sheets(tmp_path):
    write_run(tmp_path)
    for folder, names in (
        ("samples", ["rollout_000000.png", "rollout_000004.png", "text_rollout_000002.png"]),
        ("eval", ["step_000003.png", "step_000006.gif", "notes.txt"]),
    ):
        (tmp_path / folder).mkdir()
        for name in names:
            if name.endswith(".txt"):
                (tmp_path / folder / name).write_text("not a sheet")
            else:
                Image.new("RGB", (4, 4)).save(tmp_path / folder / name)
    assert [p.name for p in latest_sheets(tmp_path / "samples")] == [
        "rollout_000004.png",
        "text_rollout_000002.png",
    ]
    assert [p.name for p in latest_sheets(tmp_path / "eval")] == ["step_000006.gif"]
    assert refresh_run_views(tmp_path)
    assert os.stat(tmp_path / REPORT).st_mode & 0o777 == 0o600
    page = render_report(tmp_path)
    assert "data:image/gif;base64," in page and 'src="http' not in page
    assert format_value(-0.24375) == "-0.2437" and format_value(3.1e-5) == "3.100e-05"
    assert format_value(None) == format_value(float("nan")) == "–"


def test_a_failed_draw_is_one_warning_line_not_an_exception(tmp_path, capsys):
    write_run(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:  # an unreadable line before the last
        f.write("{not json\n" + json.dumps({"step": 9}) + "\n")
    assert refresh_run_views(tmp_path) is False
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        f"[unirl] warning: could not draw curves/ and report.html in {tmp_path}: ValueError: "
    )
    assert lines[0].endswith("; training goes on")
    assert not (tmp_path / REPORT).exists()


def test_overwrite_clears_curves_and_report(tmp_path):
    from unirl.trainer.output import OutputDir

    write_run(tmp_path)
    assert refresh_run_views(tmp_path)
    removed = OutputDir(tmp_path).clear_run()
    assert {"curves/", REPORT} <= set(removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
