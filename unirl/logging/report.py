"""``report.html``: one self-contained page per run that a browser opens from disk (no server,
no request leaves the file: images are inlined as ``data:`` URIs, the style is inline, there
is no script). It shows the curves (``curves/``), a metrics summary, the eval table, the
latest eval and train contact sheets, and the resolved config (``config.yaml``, credentials
already redacted there).

The page carries the config (hosts and paths of the deployment), so like ``config.yaml`` it
is readable by its owner only. ``refresh_run_views`` redraws curves and page together and
never raises: a failure is one ``[unirl] warning:`` line and training goes on.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from datetime import datetime, timedelta
from pathlib import Path

from markupsafe import Markup

from unirl.logging.curves import CURVES_DIR, component_names, draw_curves, read_rows
from unirl.logging.trackers import as_float

REPORT = "report.html"
CURVE_FILES = (
    ("reward.png", "Reward: train (± std over the rollout's samples) and eval"),
    ("components.png", "Reward components: train solid, eval dashed"),
    ("train.png", "Loss, approx KL and gradient norm"),
)
# the train metrics the summary lists, when present (each scored / trained stage's prefix kept)
SUMMARY_SUFFIXES = (
    "reward/mean",
    "reward/std",
    "advantage/zero_std_ratio",
    "train/loss",
    "train/approx_kl",
    "train/grad_norm",
    "time/total",
)
SHEET = re.compile(r"^(?P<prefix>.*?)(?:rollout|step)_(?P<step>\d{6,})\.(?:png|gif)$")
SAMPLE = re.compile(r"^(?P<prefix>.*?)(?:rollout|step)_(?P<step>\d{6,})\.(?:png|gif|jsonl)$")
MIME = {".png": "image/png", ".gif": "image/gif"}
TEMPLATE = "report.html.j2"
RUN_INFO = "run.json"  # status, start, wall time, code version (unirl.trainer.run_info)
WRITTEN_KEYS = ("completion", "rewrite", "text")  # what a text track's sample rows call it
TEXT_ROWS = 16
TEXT_CHARS = 300

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1280px; padding: 0 16px;
       color: #111; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; }
figure { margin: 12px 0; }
figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f4f4f4; }
pre { background: #f7f7f7; padding: 12px; overflow-x: auto; font-size: 0.85em; }
.pair { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
.side { flex: 1 1 420px; min-width: 0; }
h3 { font-size: 1em; margin: 8px 0 4px; }
table.completions td { text-align: left; white-space: pre-wrap; word-break: break-word; }
table.completions td:last-child { text-align: right; }
#run-info td:first-child { color: #555; }
"""


def format_value(value: object) -> str:
    """How the page prints a number: 4 decimals in [1e-3, 1e5), else 3 significant digits in
    scientific notation; a missing or non-finite value is ``–``."""
    if value is None:
        return "–"
    number = as_float(value)
    if not math.isfinite(number):
        return "–"
    if number == 0 or 1e-3 <= abs(number) < 1e5:
        return f"{number:.4f}"
    return f"{number:.3e}"


def _data_uri(path: Path) -> str:
    mime = MIME[path.suffix.lower()]
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def latest_sheets(folder: Path) -> list[Path]:
    """The newest contact sheet of each stage prefix in ``folder`` (``samples/`` or
    ``eval/``): ``[<prefix>_]rollout_<k>.png`` / ``step_<k>.png`` / ``.gif``."""
    return [group[-1] for group in sample_groups(folder, SHEET).values()]


def sample_groups(folder: Path, pattern: re.Pattern[str] = SAMPLE) -> dict[str, list[Path]]:
    """``{prefix: [files oldest first]}`` of the sample files in ``folder`` that ``pattern``
    matches (contact sheets and, with :data:`SAMPLE`, a text run's ``.jsonl`` completions)."""
    if not folder.is_dir():
        return {}
    groups: dict[str, list[tuple[int, Path]]] = {}
    for path in folder.iterdir():
        match = pattern.match(path.name)
        if match is not None:
            groups.setdefault(match["prefix"], []).append((int(match["step"]), path))
    return {prefix: [path for _, path in sorted(found)] for prefix, found in sorted(groups.items())}


def _step(path: Path) -> int:
    match = SAMPLE.match(path.name)
    assert match is not None
    return int(match["step"])


def completion_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """``(columns, rows)`` of a text sample file (one JSON object per line, as the text
    trainers write them): the prompt, what the model wrote (``completion``, a prompt
    enhancer's ``rewrite``, a unified model's ``text``), the reference ``answer`` when the
    rows carry one, and the reward; at most ``TEXT_ROWS`` rows, long texts cut."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = records[:TEXT_ROWS]
    written = next((k for k in WRITTEN_KEYS if any(k in r for r in records)), "completion")
    columns = ["prompt", written]
    if any(r.get("answer") is not None for r in records):
        columns.append("answer")
    columns.append("reward")

    def cell(record: dict[str, object], column: str) -> str:
        value = record.get(column)
        if column == "reward":
            return format_value(value)
        text = "–" if value is None else str(value)
        return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"

    return columns, [[cell(r, c) for c in columns] for r in records]


def _sample_item(path: Path, root: Path, kind: str) -> dict[str, object]:
    step = _step(path)
    label = f"rollout {step}" if kind == "train" else f"after {step} rollouts"
    item: dict[str, object] = {"step": step, "label": label, "file": str(path.relative_to(root))}
    if path.suffix == ".jsonl":
        item["columns"], item["rows"] = completion_rows(path)
    else:
        item["uri"] = _data_uri(path)
    return item


def sample_section(root: Path, folder: str, kind: str) -> dict[str, object]:
    """The first and the newest samples of each stage prefix, side by side (one when they are
    the same file): a contact sheet inlined, or a text run's completions as a table. A stage
    that wrote both a sheet and a ``.jsonl`` (a prompt enhancer) shows the sheet."""
    groups = []
    for prefix, paths in sample_groups(root / folder).items():
        sheets = [p for p in paths if p.suffix in MIME]
        chosen = sheets or paths
        ends = [chosen[0], chosen[-1]] if len(chosen) > 1 else chosen[:1]
        groups.append({"prefix": prefix, "entries": [_sample_item(p, root, kind) for p in ends]})
    title = "Eval samples" if kind == "eval" else "Training samples"
    return {
        "id": f"{kind}-samples",
        "title": f"{title}: the first beside the latest",
        "groups": groups,
        "none": f"{kind} samples",
    }


def run_info(root: Path) -> dict[str, str]:
    """Status, wall time, start and code version from ``run.json`` (the trainer's); ``–``
    for what it does not record (a folder from before it existed)."""
    path = root / RUN_INFO
    info = json.loads(path.read_text()) if path.is_file() else {}
    wall = info.get("wall_s")
    return {
        "status": str(info.get("status", "–")),
        "wall": "–" if wall is None else str(timedelta(seconds=round(float(wall)))),
        "started": str(info.get("started", "–")),
        "commit": str(info.get("commit", "–")),
    }


def _summary_keys(rows: list[dict[str, object]]) -> list[str]:
    present = {k for r in rows for k in r}
    keys = []
    for suffix in SUMMARY_SUFFIXES:
        keys += sorted(k for k in present if k == suffix or k.endswith("/" + suffix))
        if suffix == "reward/std":  # components right after the total
            keys += [k for k in component_names(rows) if k not in keys]
    return keys


def _last_value(rows: list[dict[str, object]], key: str) -> object:
    return next((r[key] for r in reversed(rows) if key in r), None)


def _first_value(rows: list[dict[str, object]], key: str) -> object:
    return next((r[key] for r in rows if key in r), None)


def _summary(train: list[dict[str, object]]) -> dict[str, object]:
    rows = []
    for key in _summary_keys(train):
        values = [as_float(r[key]) for r in train if r.get(key) is not None]
        finite = [v for v in values if math.isfinite(v)]
        cells = [
            _first_value(train, key),
            _last_value(train, key),
            min(finite) if finite else None,
            max(finite) if finite else None,
        ]
        rows.append({"key": key, "cells": [format_value(v) for v in cells]})
    return {
        "rows": rows,
        "first": train[0]["step"] if train else None,
        "last": train[-1]["step"] if train else None,
    }


def _eval_keys(evals: list[dict[str, object]]) -> list[str]:
    present = {k for r in evals for k in r}
    keys = sorted(k for k in present if re.fullmatch(r"eval/(?:[^/]+/)?reward/mean", k))
    return keys + [f"eval/{k}" for k in component_names(evals, "eval/") if f"eval/{k}" not in keys]


def render_report(output_dir: str | Path) -> str:
    """The page's HTML for the run in ``output_dir`` (curves as they are on disk), rendered
    by jinja2 from ``report.html.j2`` with autoescaping on."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    root = Path(output_dir).resolve()
    train = read_rows(root / "metrics.jsonl")
    evals = read_rows(root / "eval_metrics.jsonl")
    config_path = root / "config.yaml"
    eval_keys = _eval_keys(evals)
    env = Environment(
        loader=FileSystemLoader(str(Path(__file__).parent)),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(TEMPLATE).render(
        name=root.name,
        root=str(root),
        style=Markup(STYLE),
        rollouts=len(train),
        last=f"last: rollout {train[-1]['step']}" if train else "no rollout yet",
        written=datetime.now().astimezone().isoformat(timespec="seconds"),
        info=run_info(root),
        curves=[
            {
                "id": Path(name).stem,
                "name": name,
                "uri": _data_uri(root / CURVES_DIR / name),
                "caption": caption,
            }
            for name, caption in CURVE_FILES
            if (root / CURVES_DIR / name).is_file()
        ],
        summary=_summary(train),
        eval_keys=eval_keys,
        evals=[
            {"step": r["step"], "cells": [format_value(r.get(k)) for k in eval_keys]} for r in evals
        ],
        sample_sections=[
            sample_section(root, "eval", "eval"),
            sample_section(root, "samples", "train"),
        ],
        config=config_path.read_text() if config_path.exists() else "(no config.yaml)",
    )


def write_report(output_dir: str | Path) -> Path:
    """Write ``output_dir/report.html`` whole (tmp file, rename), owner-readable only."""
    root = Path(output_dir)
    path = root / REPORT
    text = render_report(root)
    tmp = path.with_name(f".{REPORT}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def refresh_run_views(output_dir: str | Path) -> bool:
    """Redraw ``curves/`` and ``report.html``; returns whether both were written. A failure
    (a full disk, a metrics file a reader cannot parse) is printed as one warning line naming
    the error; it never stops the run."""
    try:
        draw_curves(output_dir)
        write_report(output_dir)
    except Exception as exc:
        first = next(iter(str(exc).strip().splitlines()), "")
        print(
            f"[unirl] warning: could not draw curves/ and report.html in {output_dir}: "
            f"{type(exc).__name__}: {first}; training goes on",
            flush=True,
        )
        return False
    return True
