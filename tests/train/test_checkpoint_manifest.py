"""The checkpoint manifest (bytes + sha256 of every file, in ``trainer_state.json``): written
at save, checked by ``verify_checkpoint``; a bad file is named. A full disk is said in words
and leaves nothing under the checkpoint's name. The ``UNIRL_FAULT`` test hook."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from unirl.train import CheckpointError
from unirl.train import checkpoint as ckpt


def _payload(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "meta": {"kind": "adapter", "step": 2, "world_size": 1},
        "model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)},
        "ema": {"w": torch.ones(2, 3)},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {"last_epoch": 2},
        "extra": extra or {"rollout_index": 2},
        "rng": [ckpt.capture_rng_state()],
    }


def _meta(path: Path) -> dict[str, Any]:
    return json.loads((path / ckpt.STATE_FILE).read_text())


def test_manifest_holds_size_and_sha256_of_every_file(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "step_000002", _payload())
    meta = _meta(path)
    assert (
        sorted(meta["manifest"])
        == sorted(meta["files"])
        == [
            "ema.safetensors",
            "extra.pt",
            "model.safetensors",
            "optimizer.pt",
            "rng/rank_00000.pt",
        ]
    )
    for name, entry in meta["manifest"].items():
        data = (path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert ckpt.verify_checkpoint(path)["step"] == 2
    assert ckpt.read_checkpoint(path)["extra"] == {"rollout_index": 2}


def test_truncated_file_is_named_by_verify_and_by_read(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "c", _payload())
    bad = path / "optimizer.pt"
    size = bad.stat().st_size
    bad.write_bytes(bad.read_bytes()[:100])
    expected = f"{bad} is 100 bytes, the checkpoint manifest says {size} (truncated or overwritten)"
    with pytest.raises(CheckpointError) as err:
        ckpt.verify_checkpoint(path)
    assert str(err.value) == expected
    with pytest.raises(CheckpointError) as err:
        ckpt.read_checkpoint(path)
    assert str(err.value) == expected


def test_flipped_byte_is_found_by_the_hash_only(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "c", _payload())
    bad = path / "model.safetensors"
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte of tensor data differs
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        ckpt.verify_checkpoint(path)
    assert str(err.value) == f"{bad}: sha256 differs from the checkpoint manifest (corrupt)"
    ckpt.verify_checkpoint(path, hashes=False)  # sizes alone cannot see it


def test_missing_file_and_torn_marker_are_named(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "c", _payload())
    (path / "rng" / "rank_00000.pt").unlink()
    with pytest.raises(CheckpointError) as err:
        ckpt.verify_checkpoint(path)
    assert str(err.value) == (
        f"checkpoint {path} lacks rng/rank_00000.pt ({path}/rng/rank_00000.pt missing)"
    )
    marker = path / ckpt.STATE_FILE
    marker.write_text(marker.read_text()[:40])
    with pytest.raises(CheckpointError, match=r"trainer_state\.json is not valid JSON"):
        ckpt.verify_checkpoint(path)


def test_checkpoint_without_manifest_checks_safetensors_lengths(tmp_path: Path) -> None:
    path = ckpt.write_checkpoint(tmp_path / "c", _payload())
    meta = _meta(path)
    del meta["manifest"]  # as written before manifests existed
    (path / ckpt.STATE_FILE).write_text(json.dumps(meta))
    ckpt.verify_checkpoint(path)
    bad = path / "ema.safetensors"
    size = bad.stat().st_size
    bad.write_bytes(bad.read_bytes()[:-8])
    with pytest.raises(CheckpointError) as err:
        ckpt.verify_checkpoint(path)
    assert str(err.value) == (
        f"{bad} is {size - 8} bytes, its safetensors header describes {size} (truncated)"
    )
    (path / "extra.pt").write_bytes(b"not a zip")  # torch.load fails: the file is named
    bad.write_bytes(bad.read_bytes() + b"\0" * 8)
    with pytest.raises(CheckpointError, match=rf"^{path}/extra\.pt cannot be read"):
        ckpt.read_checkpoint(path)


class _FullDisk:
    """A file that takes ``room`` bytes, then fails as a full disk does."""

    def __init__(self, path: Path, room: int) -> None:
        self.f = path.open("wb")
        self.room = room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.f.write(bytes(data[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def test_full_disk_says_so_names_the_file_and_leaves_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def save_torch(obj: Any, path: Path) -> None:  # torch's own writer, on a disk that fills
        torch.save(obj, _FullDisk(path, room=64))

    monkeypatch.setattr(ckpt, "_save_torch", save_torch)
    final = tmp_path / "checkpoints" / "step_000002"
    with pytest.raises(CheckpointError) as err:
        ckpt.write_checkpoint(final, _payload())
    assert str(err.value) == (
        f"checkpoint {final}: the disk is full (no space left on device) while writing "
        f"{final}/optimizer.pt; the partial write was removed. Free space under "
        f"{final.parent} (older checkpoints can go) and rerun with resume=auto"
    )
    assert list(final.parent.iterdir()) == []  # no step_000002, no step_000002.tmp-<pid>


def test_short_safetensors_write_is_caught_at_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ckpt._save_tensors

    def stops_short(tensors: dict[str, torch.Tensor], path: Path) -> None:
        real(tensors, path)
        os.truncate(path, path.stat().st_size - 4)  # a writer that lost its tail silently

    monkeypatch.setattr(ckpt, "_save_tensors", stops_short)
    final = tmp_path / "c"
    with pytest.raises(CheckpointError, match=r"model\.safetensors failed .*stopped short"):
        ckpt.write_checkpoint(final, _payload())
    assert list(tmp_path.iterdir()) == []


def test_disk_full_is_found_behind_wrapping_errors() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from inner
    except RuntimeError as outer:
        assert ckpt.disk_full(outer)
    assert ckpt.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not ckpt.disk_full(OSError(errno.EACCES, "Permission denied"))


def test_fault_hook_exits_137_only_at_its_point_and_step() -> None:
    code = (
        "from unirl.train.checkpoint import fault_point\n"
        "fault_point('kill_during_checkpoint', 1)\n"
        "fault_point('other_point', 2)\n"
        "print('passed step 1', flush=True)\n"
        "fault_point('kill_during_checkpoint', 2)\n"
        "print('unreachable')\n"
    )
    env = {**os.environ, "UNIRL_FAULT": "kill_during_checkpoint:2"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 137
    assert proc.stdout.splitlines() == [
        "passed step 1",
        "[unirl] UNIRL_FAULT=kill_during_checkpoint:2: exiting with status 137",
    ]
