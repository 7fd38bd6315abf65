"""Checkpoint directory layout, atomic write and read, and RNG state capture / restore.

Layout of ``<dir>`` (written by rank 0 alone; the other ranks send their RNG states to it):

    trainer_state.json       format, kind ("adapter" | "full"), step, adapters, world size, files
    model.safetensors        adapter parameters (every adapter, peft names) or the full state dict
    ema.safetensors          EMA of the trainable parameters (when EMA is on)
    optimizer.pt             {"optimizer": full optimizer state (FQN keys), "scheduler": ...}
    extra.pt                 the caller's ``extra`` dict
    rng/rank_00000.pt        torch / CUDA / numpy / python RNG states, one file per rank

The directory is built as ``<dir>.tmp-<pid>`` and renamed into place; ``trainer_state.json`` is
the last file written, so a directory under the final name is always complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FORMAT = "unirl.train.checkpoint/1"
STATE_FILE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
EMA_FILE = "ema.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra.pt"
RNG_DIR = "rng"


class CheckpointError(RuntimeError):
    """A checkpoint directory is missing, incomplete, or does not fit the backend."""


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank_{rank:05d}.pt"


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states in a ``torch.load(weights_only=True)``-safe form."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    import numpy as np

    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["kind"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield an empty ``<final>.tmp-<pid>`` to fill; on success it replaces ``final``.

    On an exception the temporary directory is removed and ``final`` (a previous checkpoint)
    is left untouched. Replacing an existing ``final`` takes two renames (old -> ``.old-<pid>``,
    new -> ``final``), then deletes the old one.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))


def write_checkpoint(final: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (see :meth:`FSDPBackend.state_dict_for_checkpoint` plus ``extra`` and
    ``rng``: a list of per-rank states) atomically to ``final``. Rank 0 only."""
    final = Path(final)
    with atomic_directory(final) as tmp:
        _save_tensors(payload["model"], tmp / MODEL_FILE)
        files = [MODEL_FILE, OPTIMIZER_FILE, EXTRA_FILE]
        if payload.get("ema") is not None:
            _save_tensors(payload["ema"], tmp / EMA_FILE)
            files.append(EMA_FILE)
        torch.save(
            {"optimizer": payload["optimizer"], "scheduler": payload["scheduler"]},
            tmp / OPTIMIZER_FILE,
        )
        torch.save(payload.get("extra") or {}, tmp / EXTRA_FILE)
        (tmp / RNG_DIR).mkdir()
        for rank, state in enumerate(payload["rng"]):
            torch.save(state, tmp / rng_file(rank))
            files.append(rng_file(rank))
        meta = dict(payload["meta"], format=CHECKPOINT_FORMAT, files=files)
        (tmp / STATE_FILE).write_text(
            json.dumps(meta, indent=2, sort_keys=True)
        )  # last: the marker
    return final


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint; raises :class:`CheckpointError` naming the
    problem (missing, interrupted replace, other format)."""
    path = Path(path)
    marker = path / STATE_FILE
    if not marker.is_file():
        leftovers = (
            sorted(p.name for p in path.parent.glob(f"{path.name}.old-*"))
            if path.parent.is_dir()
            else []
        )
        hint = (
            f"; an interrupted replace left {leftovers} next to it (rename it back)"
            if leftovers
            else ""
        )
        raise CheckpointError(f"no checkpoint at {path} ({STATE_FILE} missing){hint}")
    meta = json.loads(marker.read_text())
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{marker}: format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}"
        )
    return meta


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Everything :func:`write_checkpoint` wrote, on CPU. Rank 0 only."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = read_meta(path)
    for name in meta["files"]:
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} lacks {name}")
    opt = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    return {
        "meta": meta,
        "model": load_file(str(path / MODEL_FILE)),
        "ema": load_file(str(path / EMA_FILE)) if EMA_FILE in meta["files"] else None,
        "optimizer": opt["optimizer"],
        "scheduler": opt["scheduler"],
        "extra": torch.load(path / EXTRA_FILE, map_location="cpu", weights_only=True),
        "rng": [
            torch.load(path / rng_file(r), map_location="cpu", weights_only=True)
            for r in range(int(meta["world_size"]))
        ],
    }
