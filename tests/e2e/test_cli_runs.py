"""Runs through the real entrypoint, as a user starts them: a multirun gives each job its own
folder; a worker failure leads the console with one line and leaves its traceback in
``train.log``."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from e2e_support import read_metrics

QUICK = [
    "--config-name=diffusion/sd3_tiny_trainside",
    "num_rollouts=2",
    "eval_interval=0",
    "save_interval=0",
    "logging.gallery_interval=0",
]


def _cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unirl.train_diffusion", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": "", **env},
        cwd=cwd,
        timeout=300,
    )


def _sweep_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "unirl-sweep-*")))


def test_multirun_gives_each_job_its_own_folder(tmp_path: Path) -> None:
    """Two jobs (~25 s on 2 cores): each trains into ``<output_dir>/<num>_<swept values>``
    with its own config, history, adapter and train.log; Hydra writes nothing elsewhere."""
    cwd, out = tmp_path / "cwd", tmp_path / "sweep"
    cwd.mkdir()
    sweeps = _sweep_dirs()
    done = _cli(cwd, "-m", *QUICK, "backend.optimizer.lr=1e-3,2e-3", f"output_dir={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    jobs = {"0_backend.optimizer.lr=0.001": 0.001, "1_backend.optimizer.lr=0.002": 0.002}
    assert sorted(p.name for p in out.iterdir()) == sorted(jobs)
    for name, lr in jobs.items():
        job = out / name
        assert f"[unirl] multirun job {name[0]}: output_dir {job}" in done.stdout
        assert [row["step"] for row in read_metrics(job)] == [0, 1]
        assert f"lr: {lr}" in (job / "config.yaml").read_text()
        assert f"output_dir: {job}" in (job / "config.yaml").read_text()
        assert (job / "lora" / "pytorch_lora_weights.safetensors").is_file()
        log = (job / "train.log").read_text()
        assert "[unirl] trainable parameters" in log
        assert f"[unirl] finished 2 rollouts; outputs in {job}" in log
    assert not any(cwd.iterdir())  # no multirun/ folder where the user stood
    assert _sweep_dirs() <= sweeps  # the temporary sweep folder is gone


def test_worker_failure_leads_with_one_line_and_logs_the_traceback(tmp_path: Path) -> None:
    """A hub id that cannot resolve offline fails in the bundle's worker (~10 s)."""
    out = tmp_path / "run"
    failed = _cli(
        tmp_path,
        *QUICK,
        "bundle.path=nobody/no-such-model",
        f"output_dir={out}",
        HF_HUB_OFFLINE="1",
    )
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    said = [line for line in failed.stderr.splitlines() if line.startswith("[unirl]")]
    assert said[0].startswith("[unirl] error: role 'bundle' method '__init__' failed on rank 0")
    assert "ModelSourceError: model path 'nobody/no-such-model'" in said[0]
    assert said[1] == f"[unirl] the full traceback is in {out / 'train.log'}"
    assert "Traceback" not in failed.stderr
    log = (out / "train.log").read_text()
    assert said[0] in log.splitlines()
    assert "Traceback (most recent call last)" in log
    assert "--- remote traceback (rank 0) ---" in log and "resolve_model_source" in log
    assert (out / "train.log").stat().st_mode & 0o077 == 0  # owner-only, like config.yaml
