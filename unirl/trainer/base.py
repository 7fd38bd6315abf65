"""What every domain trainer shares: output folder, resume discovery, trackers, the device pool."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from unirl.config.run import RunConfig
from unirl.logging import build_trackers

CHECKPOINT_PREFIX = "step_"


class OutputDir:
    """``output_dir`` layout: ``config.yaml``, ``metrics.{jsonl,csv}``, ``eval_metrics.*``,
    ``samples/``, ``eval/``, ``checkpoints/step_<k>/``, ``lora/``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, rollout_index: int) -> Path:
        return self.checkpoints / f"{CHECKPOINT_PREFIX}{rollout_index:06d}"

    def latest_checkpoint(self) -> Path | None:
        if not self.checkpoints.is_dir():
            return None
        done = sorted(
            p
            for p in self.checkpoints.iterdir()
            if p.is_dir() and (p / "driver_state.json").is_file()
        )
        return done[-1] if done else None

    def write_config(self, data: dict[str, Any]) -> None:
        from omegaconf import OmegaConf

        OmegaConf.save(OmegaConf.create(data), self.root / "config.yaml")

    def prune_checkpoints(self, keep: int) -> None:
        if keep <= 0 or not self.checkpoints.is_dir():
            return
        done = sorted(
            p
            for p in self.checkpoints.iterdir()
            if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
        )
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def resolve_resume(cfg: RunConfig, out: OutputDir) -> Path | None:
    """``resume``: null (fresh run), ``auto`` (latest complete checkpoint in output_dir, if any)
    or a checkpoint folder (must exist)."""
    if cfg.resume in (None, "", "none", "null"):
        return None
    if cfg.resume == "auto":
        return out.latest_checkpoint()
    path = Path(cfg.resume)
    if not (path / "driver_state.json").is_file():
        raise FileNotFoundError(
            f"resume={cfg.resume!r} is not a complete checkpoint folder (no driver_state.json); "
            "use resume=auto or a checkpoints/step_XXXXXX folder"
        )
    return path


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def make_trackers(cfg: RunConfig, out: OutputDir, data: dict[str, Any]) -> Any:
    return build_trackers(
        cfg.logging.trackers,
        out.root,
        config=data,
        wandb_project=cfg.logging.wandb_project,
        wandb_run_name=cfg.logging.wandb_run_name,
    )


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Average metrics dicts (equal-size shards, so means of means are exact means)."""
    keys: list[str] = []
    for d in per_rank:
        keys.extend(k for k in d if k not in keys)
    out = {}
    for k in keys:
        vals = [float(d[k]) for d in per_rank if k in d]
        if k.endswith("/max") or k.endswith("_max"):
            out[k] = max(vals)
        elif k.endswith("/min"):
            out[k] = min(vals)
        else:
            out[k] = sum(vals) / len(vals)
    return out
