"""The trainer draws the run views: the tiny quick start, two rollouts, an eval after each."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PIL import Image

from unirl.config.entry import compose_recipe
from unirl.logging.report import format_value


def test_tiny_run_writes_curves_report_and_one_line_per_rollout(tmp_path: Path, ray_session):
    from unirl.train_diffusion import run

    out = tmp_path / "run"
    overrides = [f"output_dir={out}", "num_rollouts=2", "eval_interval=1", "save_interval=0"]
    assert run(compose_recipe("diffusion/sd3_tiny_trainside", overrides)) == 0

    assert sorted(p.name for p in (out / "curves").iterdir()) == [
        "components.png",
        "reward.png",
        "train.png",
    ]
    assert Image.open(out / "curves" / "reward.png").size == (900, 420)
    evals = [json.loads(line) for line in (out / "eval_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [0, 1, 2]  # the baseline, then after each rollout

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    page = (out / "report.html").read_text()
    row = re.search(r'<tr data-metric="reward/mean">(.*?)</tr>', page)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row[1])
    assert cells[:3] == [
        "reward/mean",
        format_value(rows[0]["reward/mean"]),
        format_value(rows[1]["reward/mean"]),
    ]
    assert page.count('<tr data-step="') == 3

    # pytest's stdout is no terminal: one plain line per rollout, in train.log as well
    log = (out / "train.log").read_text()
    lines = [line for line in log.splitlines() if line.startswith("[unirl] rollout ")]
    assert [line.split(" | ")[:2] for line in lines] == [
        ["[unirl] rollout 1/2", f"reward {rows[0]['reward/mean']:.4f}"],
        ["[unirl] rollout 2/2", f"reward {rows[1]['reward/mean']:.4f}"],
    ]
    assert all(re.search(r" \| [\d.]+ s/rollout \| ETA \d+:\d\d:\d\d$", line) for line in lines)
    assert "\r" not in log and not re.search(r"^rollouts: ", log, re.M)  # no bar

    # run.json: the end, wall time and code version, shown on the page
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "finished" and info["resumed"] is False
    assert 0 < info["wall_s"] < 600 and info["ended"] >= info["started"]
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unirl-mm .+", info["commit"]), info["commit"]
    assert '<tr data-key="status"><td>status</td><td>finished</td></tr>' in page
    assert f"<td>{info['commit']}</td>" in page
