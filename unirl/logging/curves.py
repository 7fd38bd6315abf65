"""The run's curves as PNG images under ``<output_dir>/curves/``, drawn from ``metrics.jsonl``
and ``eval_metrics.jsonl``:

- ``reward.png``: train reward (mean, shaded ± std over the rollout's samples) and eval reward
  (dots, ± std) against the rollout index, one pair per scored stage;
- ``components.png``: each reward component's mean, train solid and eval dashed, one colour
  per component (only when the reward has components);
- ``train.png``: the loss, approx KL and gradient norm of each trained stage, one panel each.

Each file is written whole (tmp file, rename), so a reader never sees half an image.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from PIL import Image

from unirl.logging.plot import PALETTE, Series, line_chart, stack
from unirl.logging.trackers import as_float, read_jsonl_rows

CURVES_DIR = "curves"
# ``reward/mean`` or ``<stage>/reward/mean``; a component is ``reward/<name>/mean`` (a name
# without a slash: ``reward/stats/<x>/mean`` are a guard's statistics, not components)
REWARD_MEAN = re.compile(r"^(?:(?P<stage>[^/]+)/)?reward/mean$")
COMPONENT_MEAN = re.compile(r"^(?:(?P<stage>[^/]+)/)?reward/(?P<name>[^/]+)/mean$")
TRAIN_PANELS = (
    ("train/loss", "loss"),
    ("train/approx_kl", "approx KL"),
    ("train/grad_norm", "grad norm"),
)


def read_rows(path: Path) -> list[dict[str, object]]:
    """The rows of a metrics ``.jsonl`` (none when it does not exist yet); read only: a torn
    last line is left for the tracker to repair."""
    if not path.exists():
        return []
    rows, _ = read_jsonl_rows(path)
    return rows


def _column(rows: list[dict[str, object]], key: str) -> tuple[list[float], list[float | None]]:
    xs, ys = [], []
    for row in rows:
        if key in row:
            xs.append(as_float(row["step"]))
            value = row[key]
            ys.append(None if value is None else as_float(value))
    return xs, ys


def _band(
    rows: list[dict[str, object]], mean_key: str
) -> tuple[list[float | None], list[float | None]] | tuple[None, None]:
    std_key = mean_key[: -len("mean")] + "std"
    if not any(std_key in r for r in rows):
        return None, None
    low: list[float | None] = []
    high: list[float | None] = []
    for row in rows:
        if mean_key not in row:
            continue
        m, s = row[mean_key], row.get(std_key)
        if m is None or s is None:
            low.append(None)
            high.append(None)
            continue
        low.append(as_float(m) - as_float(s))
        high.append(as_float(m) + as_float(s))
    return low, high


def _stage_label(stage: str | None, what: str) -> str:
    return f"{stage} {what}" if stage else what


def reward_chart(train: list[dict[str, object]], evals: list[dict[str, object]]) -> Image.Image:
    """Train and eval reward means with their ± std bands, one colour per scored stage."""
    keys = sorted(
        {k for r in train for k in r if REWARD_MEAN.match(k)}, key=lambda k: (k != "reward/mean", k)
    )
    keys += sorted(
        {
            k[len("eval/") :]
            for r in evals
            for k in r
            if k.startswith("eval/") and REWARD_MEAN.match(k[5:])
        }
        - set(keys)
    )
    series = []
    for i, key in enumerate(keys):
        stage = REWARD_MEAN.match(key).group("stage")  # type: ignore[union-attr]
        color = PALETTE[(2 * i) % len(PALETTE)]
        eval_color = PALETTE[(2 * i + 1) % len(PALETTE)]
        xs, ys = _column(train, key)
        if xs:
            low, high = _band(train, key)
            series.append(
                Series(
                    label=_stage_label(stage, "train (± std)"),
                    xs=xs,
                    ys=ys,
                    low=low,
                    high=high,
                    color=color,
                )
            )
        xs, ys = _column(evals, "eval/" + key)
        if xs:
            low, high = _band(evals, "eval/" + key)
            series.append(
                Series(
                    label=_stage_label(stage, "eval (± std)"),
                    xs=xs,
                    ys=ys,
                    low=low,
                    high=high,
                    color=eval_color,
                    markers=True,
                )
            )
    return line_chart(series, title="Reward", xlabel="rollout", ylabel="reward (mean)")


def component_names(rows: list[dict[str, object]], prefix: str = "") -> list[str]:
    """``[<stage>/]reward/<name>/mean`` keys of the rows (``prefix`` stripped), in first-seen
    order."""
    names: list[str] = []
    for row in rows:
        for key in row:
            if key.startswith(prefix) and COMPONENT_MEAN.match(key[len(prefix) :]):
                name = key[len(prefix) :]
                if name not in names:
                    names.append(name)
    return names


def components_chart(
    train: list[dict[str, object]], evals: list[dict[str, object]]
) -> Image.Image | None:
    """One colour per reward component: train solid, eval dashed with dots. ``None`` when the
    reward reported no components."""
    keys = component_names(train)
    keys += [k for k in component_names(evals, "eval/") if k not in keys]
    if not keys:
        return None
    series = []
    for i, key in enumerate(keys):
        match = COMPONENT_MEAN.match(key)
        assert match is not None
        name = f"{match['stage']}/{match['name']}" if match["stage"] else match["name"]
        color = PALETTE[i % len(PALETTE)]
        xs, ys = _column(train, key)
        if xs:
            series.append(Series(label=f"{name} train", xs=xs, ys=ys, color=color))
        xs, ys = _column(evals, "eval/" + key)
        if xs:
            series.append(
                Series(label=f"{name} eval", xs=xs, ys=ys, color=color, dashed=True, markers=True)
            )
    return line_chart(
        series, title="Reward components", xlabel="rollout", ylabel="component (mean)"
    )


def train_chart(train: list[dict[str, object]]) -> Image.Image | None:
    """Loss, approx KL and grad norm, one panel each, one line per trained stage; ``None``
    when no row has any of them."""
    panels = []
    for suffix, title in TRAIN_PANELS:
        keys = sorted({k for r in train for k in r if k == suffix or k.endswith("/" + suffix)})
        series = [
            Series(
                label=k.replace("train/", "") or k, xs=xs, ys=ys, color=PALETTE[i % len(PALETTE)]
            )
            for i, k in enumerate(keys)
            for xs, ys in [_column(train, k)]
        ]
        if series:
            panels.append(
                line_chart(series, title=title, xlabel="rollout", ylabel=title, size=(900, 300))
            )
    return stack(panels) if panels else None


def _save(image: Image.Image, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        image.save(tmp, format="PNG")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def draw_curves(output_dir: str | Path) -> list[Path]:
    """Draw every curve of the run in ``output_dir`` into ``output_dir/curves/``; returns the
    files written (``reward.png`` always, the others when their metrics exist)."""
    root = Path(output_dir)
    train = read_rows(root / "metrics.jsonl")
    evals = read_rows(root / "eval_metrics.jsonl")
    folder = root / CURVES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = [_save(reward_chart(train, evals), folder / "reward.png")]
    for name, chart in (
        ("components.png", components_chart(train, evals)),
        ("train.png", train_chart(train)),
    ):
        if chart is not None:
            written.append(_save(chart, folder / name))
        else:
            (folder / name).unlink(missing_ok=True)  # an earlier run's, not this one's
    return written
