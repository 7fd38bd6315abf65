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
import html
import math
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from unirl.logging.curves import CURVES_DIR, component_names, draw_curves, read_rows

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
MIME = {".png": "image/png", ".gif": "image/gif"}

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
"""


def format_value(value: Any) -> str:
    """How the page prints a number: 4 decimals in [1e-3, 1e5), else 3 significant digits in
    scientific notation; a missing or non-finite value is ``–``."""
    if value is None:
        return "–"
    value = float(value)
    if not math.isfinite(value):
        return "–"
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.3e}"


def _data_uri(path: Path) -> str:
    mime = MIME[path.suffix.lower()]
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def latest_sheets(folder: Path) -> list[Path]:
    """The newest contact sheet of each stage prefix in ``folder`` (``samples/`` or
    ``eval/``): ``[<prefix>_]rollout_<k>.png`` / ``step_<k>.png`` / ``.gif``."""
    if not folder.is_dir():
        return []
    newest: dict[str, tuple[int, Path]] = {}
    for path in folder.iterdir():
        match = SHEET.match(path.name)
        if match is None:
            continue
        step = int(match["step"])
        if match["prefix"] not in newest or step > newest[match["prefix"]][0]:
            newest[match["prefix"]] = (step, path)
    return [path for _, path in sorted(newest.values(), key=lambda sp: sp[1].name)]


def _summary_keys(rows: list[dict[str, Any]]) -> list[str]:
    present = {k for r in rows for k in r}
    keys = []
    for suffix in SUMMARY_SUFFIXES:
        keys += sorted(k for k in present if k == suffix or k.endswith("/" + suffix))
        if suffix == "reward/std":  # components right after the total
            keys += [k for k in component_names(rows) if k not in keys]
    return keys


def _last_value(rows: list[dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in reversed(rows) if key in r), None)


def _first_value(rows: list[dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in rows if key in r), None)


def summary_table(train: list[dict[str, Any]]) -> str:
    """Metric | first rollout | last rollout | min | max, over the train rows."""
    if not train:
        return "<p>No rollout logged yet.</p>"
    first, last = train[0]["step"], train[-1]["step"]
    head = (
        f"<thead><tr><th>metric</th><th>rollout {first}</th><th>rollout {last}</th>"
        "<th>min</th><th>max</th></tr></thead>"
    )
    body = []
    for key in _summary_keys(train):
        values = [float(r[key]) for r in train if r.get(key) is not None]
        finite = [v for v in values if math.isfinite(v)]
        cells = [
            _first_value(train, key),
            _last_value(train, key),
            min(finite) if finite else None,
            max(finite) if finite else None,
        ]
        body.append(
            f'<tr data-metric="{html.escape(key)}"><td>{html.escape(key)}</td>'
            + "".join(f"<td>{format_value(v)}</td>" for v in cells)
            + "</tr>"
        )
    return f'<table id="summary">{head}<tbody>{"".join(body)}</tbody></table>'


def eval_table(evals: list[dict[str, Any]]) -> str:
    """One row per eval: the step and every eval reward mean (total first, then components)."""
    if not evals:
        return "<p>No eval yet.</p>"
    present = {k for r in evals for k in r}
    keys = sorted(k for k in present if re.fullmatch(r"eval/(?:[^/]+/)?reward/mean", k))
    keys += [f"eval/{k}" for k in component_names(evals, "eval/") if f"eval/{k}" not in keys]
    head = "<th>after rollouts</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    rows = [
        f'<tr data-step="{r["step"]}"><td>{r["step"]}</td>'
        + "".join(f"<td>{format_value(r.get(k))}</td>" for k in keys)
        + "</tr>"
        for r in evals
    ]
    return f'<table id="evals"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _figures(paths: list[Path], root: Path, caption: str) -> str:
    if not paths:
        return f"<p>No {caption} yet.</p>"
    return "".join(
        f'<figure><img src="{_data_uri(p)}" alt="{html.escape(p.name)}">'
        f"<figcaption>{html.escape(str(p.relative_to(root)))}</figcaption></figure>"
        for p in paths
    )


def render_report(output_dir: str | Path) -> str:
    """The page's HTML for the run in ``output_dir`` (curves as they are on disk)."""
    root = Path(output_dir).resolve()
    train = read_rows(root / "metrics.jsonl")
    evals = read_rows(root / "eval_metrics.jsonl")
    config_path = root / "config.yaml"
    config = config_path.read_text() if config_path.exists() else "(no config.yaml)"
    curves = "".join(
        f'<figure><img id="curve-{Path(name).stem}" src="{_data_uri(root / CURVES_DIR / name)}" '
        f'alt="{html.escape(name)}"><figcaption>{html.escape(text)}</figcaption></figure>'
        for name, text in CURVE_FILES
        if (root / CURVES_DIR / name).is_file()
    )
    written = datetime.now().astimezone().isoformat(timespec="seconds")
    last = f"rollout {train[-1]['step']}" if train else "no rollout yet"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>UniRL run: {html.escape(root.name)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>UniRL run: {html.escape(root.name)}</h1>
<p class="meta">{html.escape(str(root))} · {len(train)} rollouts logged (last: {last}) ·
{len(evals)} evals · written {written}</p>
<h2 id="curves">Curves</h2>
{curves or "<p>No curves drawn yet.</p>"}
<h2 id="metrics">Training metrics</h2>
{summary_table(train)}
<h2 id="eval">Eval</h2>
{eval_table(evals)}
<h2 id="eval-samples">Latest eval samples</h2>
{_figures(latest_sheets(root / "eval"), root, "eval sheet")}
<h2 id="train-samples">Latest training samples</h2>
{_figures(latest_sheets(root / "samples"), root, "training sheet")}
<h2 id="config">Config</h2>
<pre id="config-text">{html.escape(config)}</pre>
</body>
</html>
"""


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
