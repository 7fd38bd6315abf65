"""Checkpoint directory layout, atomic write and read, and RNG state capture / restore.

Layout of ``<dir>`` (written by rank 0 alone; the other ranks send their RNG states to it):

    trainer_state.json       format, kind ("adapter" | "full"), step, adapters, world size, files,
                             manifest ({file: {"bytes", "sha256"}})
    model.safetensors        adapter parameters (every adapter, peft names) or the full state dict
    ema.safetensors          EMA of the trainable parameters (when EMA is on)
    optimizer.pt             {"optimizer": full optimizer state (FQN keys), "scheduler": ...}
    extra.pt                 the caller's ``extra`` dict
    rng/rank_00000.pt        torch / CUDA / numpy / python RNG states, one file per rank

The directory is built as ``<dir>.tmp-<pid>`` and renamed into place; ``trainer_state.json`` is
the last file written, so a directory under the final name is always complete. Every file is
fsynced and read back once: ``trainer_state.json`` carries a ``manifest`` (bytes and sha256 of
each file) that :func:`verify_checkpoint` checks, so a truncated or corrupt file is named
before anything loads it. A failed write (a full disk included) leaves nothing under the final
name and raises :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import torch

from unirl.config.require import UserFacingError

CHECKPOINT_FORMAT = "unirl.train.checkpoint/1"
STATE_FILE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
EMA_FILE = "ema.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
EXTRA_FILE = "extra.pt"
RNG_DIR = "rng"


class CheckpointError(UserFacingError, RuntimeError):
    """A checkpoint directory is missing, incomplete, or does not fit the backend."""


_T = TypeVar("_T")


class NumpyRngState(TypedDict):
    """numpy's legacy global RNG state, ``torch.load(weights_only=True)``-safe."""

    kind: str
    keys: torch.Tensor  # the uint32 key array as int64
    pos: int
    has_gauss: int
    cached_gaussian: float


class RngState(TypedDict):
    """One process's RNG states (:func:`capture_rng_state`)."""

    torch: torch.Tensor
    numpy: NumpyRngState
    python: tuple[int, tuple[int, ...], float | None]  # random.getstate()
    cuda: list[torch.Tensor] | None


class ManifestEntry(TypedDict):
    """A checkpoint file's entry in the manifest of ``trainer_state.json``."""

    bytes: int
    sha256: str


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank_{rank:05d}.pt"


def capture_rng_state() -> RngState:
    """This process's RNG states in a ``torch.load(weights_only=True)``-safe form."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: RngState = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            # numpy types the legacy tuple's fields as str | array; keys is the uint32 array
            "keys": torch.from_numpy(keys.astype(np.int64)),  # type: ignore[union-attr]
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


def restore_rng_state(state: RngState) -> None:
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
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


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

    out: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for key, value in tensors.items():
        t = value.detach().cpu().contiguous()
        storage = t.untyped_storage().data_ptr()
        # tied weights (an LM's embedding and head) share storage, which safetensors refuses:
        # every name gets its own copy; loading writes the same values into the tie
        out[key] = t.clone() if storage in storages else t
        storages.add(storage)
    save_file(out, str(path))


def _save_torch(obj: object, path: Path) -> None:
    # a Python file object, so a failed write surfaces as the OSError (ENOSPC) behind torch's
    # RuntimeError instead of "unexpected pos"
    with path.open("wb") as f:
        torch.save(obj, f)


def _seal(path: Path) -> ManifestEntry:
    """fsync ``path`` and read it back once: its manifest entry ``{"bytes", "sha256"}``."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        os.fsync(f.fileno())
        while chunk := f.read(1 << 24):
            digest.update(chunk)
            size += len(chunk)
    if path.suffix == ".safetensors":
        problem = _safetensors_length_problem(path, size)
        if problem is not None:
            raise OSError(errno.EIO, f"{problem}: the write stopped short", str(path))
    return {"bytes": size, "sha256": digest.hexdigest()}


def _safetensors_length_problem(path: Path, size: int) -> str | None:
    """``None`` when ``path`` is as long as its header says; else what is wrong."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path} is {size} bytes, shorter than a safetensors header"
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(n))
            end = max(
                (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                default=0,
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return f"{path} has an unreadable safetensors header ({exc})"
    if size != 8 + n + end:
        return f"{path} is {size} bytes, its safetensors header describes {8 + n + end}"
    return None


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception behind it) is ENOSPC / EDQUOT."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def write_failure(target: str | Path, file: str | Path, exc: BaseException) -> CheckpointError:
    """The error for a failed checkpoint write of ``file``: a full disk is said in words."""
    target = Path(target)
    if disk_full(exc):
        return CheckpointError(
            f"checkpoint {target}: the disk is full (no space left on device) while writing "
            f"{file}; the partial write was removed. Free space under {target.parent} "
            "(older checkpoints can go) and rerun with resume=auto"
        )
    return CheckpointError(
        f"checkpoint {target}: writing {file} failed ({type(exc).__name__}: {exc}); "
        "the partial write was removed"
    )


FAULT_ENV = "UNIRL_FAULT"


def fault_point(point: str, step: int) -> None:
    """Test hook: with ``UNIRL_FAULT=<point>:<step>`` the process ends here with status 137,
    as a SIGKILL would leave it (no cleanup, no ``finally``)."""
    if os.environ.get(FAULT_ENV) == f"{point}:{step}":
        print(f"[unirl] {FAULT_ENV}={point}:{step}: exiting with status 137", flush=True)
        os._exit(137)


def write_checkpoint(final: str | Path, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` (see :func:`backend_checkpoint.state_dict_for_checkpoint` plus
    ``extra`` and ``rng``: a list of per-rank states) atomically to ``final``. Rank 0 only."""
    final = Path(final)
    current = ""  # the file being written, for the error
    manifest: dict[str, ManifestEntry] = {}
    try:
        with atomic_directory(final) as tmp:

            def put(name: str, write: Callable[[_T, Path], None], obj: _T) -> None:
                nonlocal current
                current = name
                write(obj, tmp / name)
                manifest[name] = _seal(tmp / name)

            put(MODEL_FILE, _save_tensors, payload["model"])
            files = [MODEL_FILE, OPTIMIZER_FILE, EXTRA_FILE]
            if payload.get("ema") is not None:
                put(EMA_FILE, _save_tensors, payload["ema"])
                files.append(EMA_FILE)
            put(
                OPTIMIZER_FILE,
                _save_torch,
                {"optimizer": payload["optimizer"], "scheduler": payload["scheduler"]},
            )
            put(EXTRA_FILE, _save_torch, payload.get("extra") or {})
            (tmp / RNG_DIR).mkdir()
            for rank, state in enumerate(payload["rng"]):
                put(rng_file(rank), _save_torch, state)
                files.append(rng_file(rank))
            meta = dict(payload["meta"], format=CHECKPOINT_FORMAT, files=files, manifest=manifest)
            current = STATE_FILE
            with (tmp / STATE_FILE).open("w") as f:  # last: the marker
                f.write(json.dumps(meta, indent=2, sort_keys=True))
                f.flush()
                os.fsync(f.fileno())
    except Exception as exc:
        raise write_failure(final, final / current if current else final, exc) from exc
    return final


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state.json`` of a checkpoint; raises :class:`CheckpointError` naming the
    problem (missing, interrupted replace, truncated, other format)."""
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
    try:
        meta = json.loads(marker.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{marker} is not valid JSON (truncated or corrupt: {exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{marker}: format {found!r}, expected {CHECKPOINT_FORMAT!r}")
    return meta


def verify_checkpoint(path: str | Path, *, hashes: bool = True) -> dict[str, Any]:
    """Check a checkpoint against the manifest in its ``trainer_state.json``: every file
    present, of the recorded size and (``hashes``) sha256. Returns the meta; raises
    :class:`CheckpointError` naming the first bad file. A checkpoint written before manifests
    existed is checked for presence and safetensors lengths only."""
    path = Path(path)
    meta = read_meta(path)
    manifest: dict[str, ManifestEntry] = meta.get("manifest") or {}
    for name in meta.get("files", []):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} lacks {name} ({file} missing)")
        size = file.stat().st_size
        entry = manifest.get(name)
        if entry is None:
            if file.suffix == ".safetensors":
                problem = _safetensors_length_problem(file, size)
                if problem is not None:
                    raise CheckpointError(f"{problem} (truncated)")
            continue
        if size != int(entry["bytes"]):
            raise CheckpointError(
                f"{file} is {size} bytes, the checkpoint manifest says {entry['bytes']} "
                "(truncated or overwritten)"
            )
        if hashes:
            digest = hashlib.sha256()
            with file.open("rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
            if digest.hexdigest() != entry["sha256"]:
                raise CheckpointError(
                    f"{file}: sha256 differs from the checkpoint manifest (corrupt)"
                )
    return meta


def _load(path: Path, name: str, loader: Callable[[Path], _T]) -> _T:
    try:
        return loader(path / name)
    except Exception as exc:
        raise CheckpointError(
            f"{path / name} cannot be read ({type(exc).__name__}: {exc}); the checkpoint is "
            "corrupt: resume=auto falls back to the newest checkpoint that verifies"
        ) from exc


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Everything :func:`write_checkpoint` wrote, on CPU. Rank 0 only. Checks presence and
    sizes against the manifest (hashes are the driver's job: :func:`verify_checkpoint`); a file
    that fails to load is named in the :class:`CheckpointError`."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = verify_checkpoint(path, hashes=False)

    def tensors(file: Path) -> dict[str, torch.Tensor]:
        return load_file(str(file))

    def torch_file(file: Path) -> Any:
        return torch.load(file, map_location="cpu", weights_only=True)

    opt = _load(path, OPTIMIZER_FILE, torch_file)
    return {
        "meta": meta,
        "model": _load(path, MODEL_FILE, tensors),
        "ema": _load(path, EMA_FILE, tensors) if EMA_FILE in meta["files"] else None,
        "optimizer": opt["optimizer"],
        "scheduler": opt["scheduler"],
        "extra": _load(path, EXTRA_FILE, torch_file),
        "rng": [_load(path, rng_file(r), torch_file) for r in range(int(meta["world_size"]))],
    }
