"""History is never corrupted: crashes during checkpoints, torn metrics lines and corrupt
checkpoint files resume (or are refused) with ``metrics.jsonl`` and ``eval_metrics.jsonl``
rows exactly those of an uninterrupted run, timing columns aside.

Every run is the real quick-start entrypoint in a subprocess (its own Ray runtime); kills are
deterministic through the ``UNIRL_FAULT=kill_during_checkpoint:<step>`` test hook, which ends
the driver with status 137 after the backend wrote its files and before ``driver_state.json``.
3 rollouts, a checkpoint and an eval after each. Module fixtures chain the cases so that five
runs cover them: the uninterrupted reference; a run killed during the first checkpoint; its
resume (through torn history lines) killed during the last checkpoint; with a file of the
checkpoint before it truncated, a refused explicit resume of that one and a ``resume=auto``
that falls back past both. A Ctrl-C (SIGINT to the run's process group, Ray's processes
included) stops after the rollout under way with a checkpoint, and ``resume=auto`` finishes
the run with the same history.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_support import read_metrics

from unirl.trainer.output import checkpoint_problem

RECIPE = "diffusion/sd3_tiny_trainside"
COMMON = ("num_rollouts=3", "save_interval=1", "eval_interval=1", "logging.gallery_interval=0")
HISTORY = ("metrics.jsonl", "eval_metrics.jsonl")
TORN = '{"step": 7, "reward/mean": 0.12'  # a row cut off mid-write: no closing brace, no newline
Done = subprocess.CompletedProcess


def _command(out: Path, *overrides: str, fault: str | None = None) -> dict[str, Any]:
    """The quick-start entrypoint into ``out``: ``args`` and ``env`` for ``subprocess``."""
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("UNIRL_FAULT", None)
    if fault is not None:
        env["UNIRL_FAULT"] = fault
    args = [sys.executable, "-m", "unirl.train_diffusion", f"--config-name={RECIPE}"]
    return {"args": [*args, f"output_dir={out}", *COMMON, *overrides], "env": env}


def _run(out: Path, *overrides: str, fault: str | None = None) -> Done:
    command = _command(out, *overrides, fault=fault)
    return subprocess.run(**command, capture_output=True, text=True, timeout=300)


def _timing(key: str) -> bool:
    return key.startswith(("time/", "throughput/")) or "/time/" in key


def _history(out: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [{k: v for k, v in row.items() if not _timing(k)} for row in read_metrics(out, name)]
        for name in HISTORY
    }


def _said(proc: Done, *needles: str) -> list[str]:
    """The output lines that contain any of ``needles``."""
    lines = (proc.stdout + proc.stderr).splitlines()
    return [line for line in lines if any(n in line for n in needles)]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = (tmp_path_factory.mktemp("crash") / "reference").resolve()
    done = _run(out)
    assert done.returncode == 0, done.stdout + done.stderr
    history = _history(out)
    assert [r["step"] for r in history["metrics.jsonl"]] == [0, 1, 2]
    assert [r["step"] for r in history["eval_metrics.jsonl"]] == [0, 1, 2, 3]  # 0: baseline
    return out


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Done]:
    """Killed during the first checkpoint (step 1); both history files then end in a torn
    line, as a kill or a full disk in the middle of an append leaves them; resumed with
    ``resume=auto`` and killed again during the last checkpoint (step 3). Leaves checkpoints
    1 and 2 complete and 3 without its marker."""
    out = (tmp_path_factory.mktemp("crash") / "killed").resolve()
    first = _run(out, fault="kill_during_checkpoint:1")
    assert first.returncode == 137, first.stdout + first.stderr
    assert _said(first, "UNIRL_FAULT") == [
        "[unirl] UNIRL_FAULT=kill_during_checkpoint:1: exiting with status 137"
    ]
    for name in HISTORY:
        with (out / name).open("a") as f:
            f.write(TORN)
    second = _run(out, "resume=auto", fault="kill_during_checkpoint:3")
    assert second.returncode == 137, second.stdout + second.stderr
    return out, second


@pytest.fixture(scope="module")
def truncated(
    killed_twice: tuple[Path, Done], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """A copy of the twice-killed run whose newest complete checkpoint (step 2) has lost the
    second half of ``optimizer.pt``; returns the folder and the problem ``verify`` names."""
    out = tmp_path_factory.mktemp("crash") / "truncated"
    shutil.copytree(killed_twice[0], out)
    bad = out / "checkpoints" / "step_000002" / "optimizer.pt"
    size = bad.stat().st_size
    bad.write_bytes(bad.read_bytes()[: size // 2])
    problem = (
        f"{bad} is {size // 2} bytes, the checkpoint manifest says {size} "
        "(truncated or overwritten)"
    )
    return out, problem


def test_kill_during_first_checkpoint_restarts_from_zero_with_history_cleared(
    killed_twice: tuple[Path, Done], reference: Path
) -> None:
    out, second = killed_twice
    assert _said(second, "resume=auto") == [
        f"[unirl] resume=auto: skipping step_000001: incomplete: "
        f"{out}/checkpoints/step_000001/driver_state.json missing "
        "(the run stopped while writing this checkpoint)",
        f"[unirl] resume=auto found no complete checkpoint in {out}/checkpoints: starting "
        "from rollout 0; dropped what an earlier run logged "
        "(metrics.jsonl rows: 1, eval_metrics.jsonl rows: 2)",
    ]
    # the second run trained all 3 rollouts and logged the 4 evals once each before its kill
    assert _history(out) == _history(reference)


def test_torn_last_metrics_lines_are_repaired_naming_the_file(
    killed_twice: tuple[Path, Done],
) -> None:
    out, second = killed_twice
    # the first run logged rollout 0, then the evals at 0 (baseline) and 1, before its kill
    assert _said(second, "torn") == [
        f"[unirl] {out}/{name}: dropped a torn last line (line {line}, {len(TORN)} characters: "
        f"{TORN!r}) left by a run stopped mid-write (killed, or the disk was full); repaired"
        for name, line in zip(HISTORY, (2, 3))
    ]
    # what the repaired files hold is compared row by row with the reference above and below


def test_explicit_resume_of_a_truncated_checkpoint_is_refused_naming_the_file(
    truncated: tuple[Path, str],
) -> None:
    out, problem = truncated
    folder = out / "checkpoints" / "step_000002"
    before = _history(out)
    refused = _run(out, f"resume={folder}")
    assert refused.returncode != 0
    assert f"resume='{folder}' is not a complete, loadable checkpoint: {problem}" in (
        refused.stderr + refused.stdout
    )
    assert not _said(refused, "trainable parameters")  # refused before any Ray work
    assert _history(out) == before


def test_auto_falls_back_past_an_incomplete_and_a_truncated_checkpoint(
    truncated: tuple[Path, str], reference: Path
) -> None:
    out, problem = truncated
    proc = _run(out, "resume=auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _said(proc, "resume=auto", "resumed from") == [
        f"[unirl] resume=auto: skipping step_000003: incomplete: "
        f"{out}/checkpoints/step_000003/driver_state.json missing "
        "(the run stopped while writing this checkpoint)",
        f"[unirl] resume=auto: skipping step_000002: {problem}",
        f"[unirl] resumed from {out}/checkpoints/step_000001 at rollout 1; dropped what was "
        "logged after it (metrics.jsonl rows: 2, eval_metrics.jsonl rows: 2)",
    ]
    assert _history(out) == _history(reference)  # evals 2 and 3 once each, not twice
    for step in (2, 3):  # written again, whole
        assert checkpoint_problem(out / "checkpoints" / f"step_{step:06d}") is None


def test_ctrl_c_stops_at_a_rollout_boundary_with_a_checkpoint_and_resume_finishes(
    tmp_path: Path, reference: Path
) -> None:
    out = (tmp_path / "stopped").resolve()
    # no checkpoint is due (save_interval=0): the stop writes its own; the run has its own
    # session, as a terminal's Ctrl-C reaches the whole foreground process group
    proc = subprocess.Popen(
        **_command(out, "save_interval=0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one pipe: read line by line, it cannot fill behind us
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[unirl] rollout 1/3"):
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=240)
    said = "".join(seen) + rest
    assert proc.returncode == 130, said
    stops = [line for line in said.splitlines() if line.startswith("[unirl] stopped by")]
    assert len(stops) == 1, said
    last = stops[0]
    done = int(last.split(" after rollout ")[1].split(" ")[0]) if " after rollout " in last else -1
    assert done in (1, 2), said  # the rollout under way when the signal came, then no other
    ckpt = out / "checkpoints" / f"step_{done:06d}"
    assert last == (
        f"[unirl] stopped by SIGINT after rollout {done} of 3; checkpoint {ckpt}; continue "
        "with the same command and resume=auto"
    )
    assert checkpoint_problem(ckpt) is None
    assert not (out / "lora").exists()  # the run's end (export) did not happen
    assert [r["step"] for r in read_metrics(out, "metrics.jsonl")] == list(range(done))
    resumed = _run(out, "save_interval=0", "resume=auto")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _history(out) == _history(reference)
