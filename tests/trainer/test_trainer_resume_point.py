"""Resume discovery on the driver, before any Ray work: ``resume=auto`` takes the newest
complete, loadable checkpoint and names each one it skips and why; an explicit folder that is
not one is refused naming the file; ``driver_state.json`` is written whole or not at all."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from unirl.train import CheckpointError
from unirl.train import checkpoint as ckpt
from unirl.trainer import output
from unirl.trainer.output import (
    DRIVER_STATE,
    OutputDir,
    checkpoint_problem,
    resolve_resume,
    write_json_atomic,
)


def _save(out: OutputDir, step: int, *, complete: bool = True) -> Path:
    path = out.checkpoint(step)
    payload = {
        "meta": {"kind": "adapter", "step": step, "world_size": 1},
        "model": {"w": torch.full((4,), float(step))},
        "ema": None,
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "extra": {"rollout_index": step},
        "rng": [ckpt.capture_rng_state()],
    }
    ckpt.write_checkpoint(path, payload)
    if complete:
        write_json_atomic(path / DRIVER_STATE, {"next_rollout": step})
    return path


def _auto(out: OutputDir) -> Path | None:
    return resolve_resume(SimpleNamespace(resume="auto"), out)  # type: ignore[arg-type]


def test_auto_takes_the_newest_complete_checkpoint_and_names_what_it_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = OutputDir(tmp_path)
    _save(out, 2)
    good = _save(out, 4)
    _save(out, 8, complete=False)  # killed between the backend's files and driver_state.json
    (out.checkpoints / "step_000012.tmp-4242").mkdir()  # a writer killed mid-way
    (out.checkpoints / "step_000010.old-4242").mkdir()
    torn = _save(out, 6)
    (torn / DRIVER_STATE).write_text('{"next_rol')
    assert [p.name for p in out.checkpoint_folders()] == [
        "step_000002",
        "step_000004",
        "step_000006",
        "step_000008",
    ]
    assert _auto(out) == good
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"[unirl] resume=auto: skipping step_000008: incomplete: {out.checkpoints}/step_000008/"
        "driver_state.json missing (the run stopped while writing this checkpoint)"
    )
    assert lines[1].startswith(
        f"[unirl] resume=auto: skipping step_000006: {torn}/driver_state.json is not valid JSON"
    )
    assert len(lines) == 2


def test_auto_falls_back_past_a_corrupt_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = OutputDir(tmp_path)
    older = _save(out, 1)
    newest = _save(out, 2)
    bad = newest / "model.safetensors"
    size = bad.stat().st_size
    bad.write_bytes(bad.read_bytes()[:50])
    assert _auto(out) == older
    assert capsys.readouterr().out == (
        f"[unirl] resume=auto: skipping step_000002: {bad} is 50 bytes, the checkpoint "
        f"manifest says {size} (truncated or overwritten)\n"
    )


def test_auto_without_any_complete_checkpoint_starts_fresh(tmp_path: Path) -> None:
    out = OutputDir(tmp_path)
    assert _auto(out) is None
    _save(out, 1, complete=False)
    assert _auto(out) is None


def test_explicit_folder_that_is_not_a_loadable_checkpoint_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    out = OutputDir(tmp_path)
    path = _save(out, 3)
    assert resolve_resume(SimpleNamespace(resume=str(path)), out) == path  # type: ignore[arg-type]
    (path / "extra.pt").unlink()
    with pytest.raises(CheckpointError) as err:
        resolve_resume(SimpleNamespace(resume=str(path)), out)  # type: ignore[arg-type]
    assert str(err.value) == (
        f"resume='{path}' is not a complete, loadable checkpoint: checkpoint {path} lacks "
        f"extra.pt ({path}/extra.pt missing). Use resume=auto (the newest checkpoint that "
        "verifies) or another checkpoints/step_XXXXXX folder"
    )
    assert "incomplete" in str(checkpoint_problem(tmp_path / "nowhere"))


def test_driver_state_is_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / DRIVER_STATE
    write_json_atomic(target, {"next_rollout": 1})

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output.os, "fsync", full_disk)
    with pytest.raises(OSError) as err:
        write_json_atomic(target, {"next_rollout": 2})
    assert ckpt.disk_full(err.value)
    assert json.loads(target.read_text()) == {"next_rollout": 1}  # the old one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [DRIVER_STATE]  # no tmp left
