"""The entrypoint's command line: Hydra's flags in any position (through the real entrypoint,
in a subprocess), and how a multirun names each job's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from unirl.config.entry import (
    CommandLine,
    hydra_command_line,
    job_output_dir,
    split_command_line,
    swept_keys,
)

RECIPE = "--config-name=diffusion/sd3_tiny_trainside"
DEFAULTS = [
    "hydra.run.dir=.",
    "hydra.output_subdir=null",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "unirl.train_diffusion", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
    )


def test_flags_work_before_after_and_between_overrides() -> None:
    for args in (
        ("num_rollouts=3", "--cfg", "job"),
        ("--cfg", "job", "num_rollouts=3"),
        ("num_rollouts=3", "--cfg", "job", "batch_size=4", "--resolve"),
    ):
        out = _cli(RECIPE, *args)
        assert out.returncode == 0, f"{args}: {out.stderr[-2000:]}"
        assert "\nnum_rollouts: 3\n" in out.stdout, args
    assert "\nbatch_size: 4\n" in out.stdout and "${" not in out.stdout  # resolved


def test_bare_info_and_help_work() -> None:
    info = _cli(RECIPE, "--info")
    assert info.returncode == 0, info.stderr[-2000:]
    assert "Defaults List" in info.stdout and "hydra/job_logging/none" in info.stdout
    helped = _cli(RECIPE, "num_rollouts=5", "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "== Config ==" in helped.stdout and "\nnum_rollouts: 5\n" in helped.stdout


def test_hydra_sees_overrides_then_defaults_then_flags() -> None:
    line = split_command_line(["a=1", "--cfg", "job", "b=2", "-m", "--info", "config"])
    assert line == CommandLine(
        overrides=["a=1", "b=2"], flags=["--cfg", "job", "-m", "--info", "config"], multirun=True
    )
    assert hydra_command_line(line) == [
        "a=1",
        "b=2",
        *DEFAULTS,
        "--cfg",
        "job",
        "-m",
        "--info",
        "config",
    ]
    # a user's own Hydra setting wins over ours; a multirun's sweep folder is ours unless named
    own = CommandLine(
        overrides=["hydra.run.dir=/x", "hydra/job_logging=default"], flags=[], multirun=True
    )
    assert hydra_command_line(own, sweep_dir="/tmp/s") == [
        "hydra.run.dir=/x",
        "hydra/job_logging=default",
        "hydra.output_subdir=null",
        "hydra/hydra_logging=none",
        "hydra.sweep.dir='/tmp/s'",
    ]
    named = CommandLine(overrides=["hydra.sweep.dir=/mine"], flags=["-m"], multirun=True)
    assert "hydra.sweep.dir='/tmp/s'" not in hydra_command_line(named, sweep_dir="/tmp/s")
    # what Hydra's parser refuses, and --version, go to Hydra as given
    assert split_command_line(["--cfg", "nonsense"]) is None
    assert split_command_line(["--version"]) is None


def test_multirun_job_folders_are_named_by_number_and_swept_values() -> None:
    swept = swept_keys(["backend.optimizer.lr=1e-3,2e-3", "num_rollouts=2", "seed=range(0,2)"])
    assert swept == {"backend.optimizer.lr", "seed"}
    job = ["backend.optimizer.lr=0.002", "num_rollouts=2", "seed=1"]
    assert job_output_dir("out/run", 3, job, swept) == Path(
        "out/run/3_backend.optimizer.lr=0.002,seed=1"
    )
    assert job_output_dir("out/run", 0, ["num_rollouts=2"], set()) == Path("out/run/0")
    # a swept output_dir stays the parent; a value with a path in it stays one folder
    assert job_output_dir(
        "a", 1, ["output_dir=a", "data_source.path=/d/p.txt"], {"output_dir", "data_source.path"}
    ) == Path("a/1_data_source.path=_d_p.txt")


def test_a_failed_multirun_job_is_reported_and_the_sweep_goes_on(tmp_path: Path) -> None:
    """Both jobs refused by the validators (before Ray): each says so, the sweep runs both,
    and the exit code says it failed."""
    out = _cli("-m", RECIPE, "batch_size=3,5", "stack.micro_batch_size=8", f"output_dir={tmp_path}")
    assert out.returncode == 1, out.stderr[-2000:]
    assert "[unirl] multirun job 0" in out.stdout and "[unirl] multirun job 1" in out.stdout
    assert out.stderr.count("[unirl] configuration error") == 2
    assert out.stderr.splitlines()[-2:] == [
        f"[unirl] multirun: job 0 ({tmp_path}/0_batch_size=3): exit code 2",
        f"[unirl] multirun: job 1 ({tmp_path}/1_batch_size=5): exit code 2",
    ]
