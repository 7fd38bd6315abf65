"""Metric trackers behind one interface: local files always, TensorBoard and W&B optional."""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, SupportsFloat


def as_float(value: object) -> float:
    """``float(value)`` of a metric read back from JSON (a number, or a numeric string);
    anything else raises the TypeError ``float`` raises."""
    if isinstance(value, SupportsFloat | str):
        return float(value)
    raise TypeError(
        f"float() argument must be a string or a real number, not {type(value).__name__!r}"
    )


def _clean(metrics: Mapping[str, object]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        try:
            out[k] = as_float(v)
        except (TypeError, ValueError):
            continue
    return out


class LocalTracker:
    """``metrics.jsonl`` (one object per step, appended) and ``metrics.csv`` (rewritten with
    the union of columns, so a metric that appears late still gets a column).

    An existing ``metrics.jsonl`` is read back (resume keeps history). A torn last line — a
    run killed or out of disk space mid-append — is dropped and the file rewritten, with one
    line saying so; an unreadable line before the last is an error naming file and line."""

    def __init__(self, output_dir: str | Path, *, prefix: str = "metrics") -> None:
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / f"{prefix}.jsonl"
        self.csv = self.dir / f"{prefix}.csv"
        self.rows: list[dict[str, object]] = []
        if self.jsonl.exists():  # resume: keep history, the CSV is rebuilt from it
            self.rows, repair = read_jsonl_rows(self.jsonl)
            if repair is not None:
                print(f"[unirl] {self.jsonl}: {repair}; repaired", flush=True)
                self._rewrite()

    def truncate_after(self, step: int) -> int:
        """Drop rows past ``step`` (a resumed run rewrites what the killed run logged after
        its last checkpoint); returns how many were dropped. The rewrite is atomic."""
        kept = [r for r in self.rows if as_float(r.get("step", -1)) <= step]
        dropped = len(self.rows) - len(kept)
        if dropped:
            self.rows = kept
            self._rewrite()
        return dropped

    def _rewrite(self) -> None:
        tmp = self.jsonl.with_suffix(".jsonl.tmp")
        with tmp.open("w") as f:
            for row in self.rows:
                f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.jsonl)
        self._write_csv()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row: dict[str, object] = {"step": step, **_clean(metrics)}
        row = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in row.items()
        }
        self.rows.append(row)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._write_csv()

    def _write_csv(self) -> None:
        columns: list[str] = []
        for row in self.rows:
            columns.extend(k for k in row if k not in columns)
        tmp = self.csv.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.csv)

    def close(self) -> None:
        pass


def read_jsonl_rows(path: Path) -> tuple[list[dict[str, object]], str | None]:
    """The rows of a metrics ``.jsonl`` and, when its end needs repair, what was wrong: a
    torn (unparsable) last line, or a last line without its newline. Raises ``ValueError``
    naming file and line for an unparsable line before the last."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows: list[dict[str, object]] = []
    repair = None
    for k, (number, line) in enumerate(numbered):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a {type(row).__name__}, not an object")
        except ValueError as exc:
            if k < len(numbered) - 1:
                raise ValueError(
                    f"{path}:{number} is not a JSON object ({exc}); only a torn last line is "
                    "repaired: fix or delete that line"
                ) from exc
            shown = line if len(line) <= 60 else line[:60] + "..."
            repair = (
                f"dropped a torn last line (line {number}, {len(line)} characters: {shown!r}) left by "
                "a run stopped mid-write (killed, or the disk was full)"
            )
            break
        rows.append(row)
    if repair is None and text.strip() and not text.endswith("\n"):
        repair = "added the newline missing after the last line"
    return rows, repair


class TensorBoardTracker:
    def __init__(self, output_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "logging.trackers has 'tensorboard' but the tensorboard package is missing: "
                "pip install 'unirl-mm[tensorboard]'"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(Path(output_dir) / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in _clean(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_media(self, step: int, name: str, path: Path) -> None:
        """A PNG sheet through ``SummaryWriter.add_image``; an animated GIF through
        ``add_images`` as its frames side by side (TensorBoard's public video summary needs
        moviepy, which is not a dependency)."""
        import numpy as np
        from PIL import Image, ImageSequence

        if path.suffix == ".jsonl":  # a text run's samples: a markdown table in the text tab
            columns, rows = sample_table(path)
            lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
            self.writer.add_text(name, "\n".join(lines), step)
            self.writer.flush()
            return
        with Image.open(path) as img:
            frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(img)]
        if len(frames) == 1:
            self.writer.add_image(name, frames[0], step, dataformats="HWC")
        else:
            self.writer.add_images(name, np.stack(frames), step, dataformats="NHWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def sample_table(path: Path) -> tuple[list[str], list[list[object]]]:
    """``(columns, rows)`` of a text run's samples file (one JSON object per line): every key
    any row has, in first-seen order."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    columns: list[str] = []
    for record in records:
        columns += [k for k in record if k not in columns]
    return columns, [[r.get(c) for c in columns] for r in records]


def _cell(value: object) -> str:
    """One markdown table cell: pipes escaped, one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


WANDB_RUN_ID = "wandb_run_id"  # in the run folder: the W&B run a resumed run continues


class WandbTracker:
    def __init__(
        self,
        output_dir: str | Path,
        *,
        project: str | None,
        run_name: str | None,
        config: dict[str, object],
    ) -> None:
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "logging.trackers has 'wandb' but wandb is not installed: pip install 'unirl-mm[wandb]'"
            ) from exc
        from unirl.config.secrets import redact_text, secret_values

        # W&B records the command line in its run files (wandb-metadata.json, uploaded with an
        # online run): it sees it with the recipe's credentials masked
        argv, secrets = sys.argv, secret_values(config) | secret_values(_overrides(sys.argv))
        sys.argv = [redact_text(a, secrets) for a in argv]
        # one W&B run per run folder: its id is kept in the folder, so a resumed run (and any
        # later start into the same folder) continues the same W&B run instead of a second one
        id_file = Path(output_dir) / WANDB_RUN_ID
        run_id = id_file.read_text().strip() if id_file.is_file() else None  # None: W&B's own
        try:
            self.run = wandb.init(
                project=project or "unirl",
                name=run_name,
                dir=str(output_dir),
                config=config,
                id=run_id,
                resume="allow",
            )
        finally:
            sys.argv = argv
        if not id_file.is_file():
            id_file.write_text(self.run.id + "\n")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(_clean(metrics), step=step)

    def log_media(self, step: int, name: str, path: Path) -> None:
        """A PNG as ``wandb.Image``, an animated GIF as ``wandb.Video`` (W&B plays GIFs), a
        text run's ``.jsonl`` samples as a ``wandb.Table``."""
        import wandb

        item: object
        if path.suffix == ".jsonl":
            columns, rows = sample_table(path)
            item = wandb.Table(columns=list[str | int](columns), data=rows)
        elif path.suffix == ".gif":
            item = wandb.Video(str(path))
        else:
            item = wandb.Image(str(path))
        self.run.log({name: item}, step=step)

    def close(self) -> None:
        self.run.finish()


def _overrides(argv: list[str]) -> dict[str, str]:
    """``{last key part: value}`` of the ``key=value`` arguments (``reward.token=abc`` ->
    ``{"token": "abc"}``), so a credential given on the command line is known as one."""
    pairs = (a.lstrip("+~").split("=", 1) for a in argv if "=" in a)
    return {key.rsplit(".", 1)[-1]: value for key, value in pairs}


class ExternalTracker(Protocol):
    """A tracker besides the local files (``TensorBoardTracker``, ``WandbTracker``): it also
    takes media."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_media(self, step: int, name: str, path: Path) -> None: ...

    def close(self) -> None: ...


class MultiTracker:
    """Fans one ``log`` out to every configured tracker."""

    def __init__(self, trackers: list[LocalTracker | ExternalTracker]) -> None:
        self.trackers = trackers

    @property
    def local(self) -> LocalTracker | None:
        return next((t for t in self.trackers if isinstance(t, LocalTracker)), None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for t in self.trackers:
            t.log(step, metrics)

    def log_external(
        self, step: int, metrics: dict[str, float], media: dict[str, Path] | None = None
    ) -> None:
        """Metrics (and image / GIF files) for TensorBoard and W&B only: the local tracker
        keeps them in their own file (``eval_metrics.jsonl``, the ``eval/`` sheets)."""
        for t in self.trackers:
            if isinstance(t, LocalTracker):
                continue
            t.log(step, metrics)
            for name, path in (media or {}).items():
                t.log_media(step, name, Path(path))

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def build_trackers(
    names: list[str],
    output_dir: str | Path,
    *,
    config: dict[str, object],
    wandb_project: str | None = None,
    wandb_run_name: str | None = None,
) -> MultiTracker:
    trackers: list[LocalTracker | ExternalTracker] = [LocalTracker(output_dir)]
    if "tensorboard" in names:
        trackers.append(TensorBoardTracker(output_dir))
    if "wandb" in names:
        trackers.append(
            WandbTracker(output_dir, project=wandb_project, run_name=wandb_run_name, config=config)
        )
    return MultiTracker(trackers)
