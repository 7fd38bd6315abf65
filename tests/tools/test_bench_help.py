"""``unirl.tools.bench --help`` lists the benchmark's own options before Hydra's help."""

from __future__ import annotations

import subprocess
import sys


def test_bench_help_shows_its_own_flags() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unirl.tools.bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("usage: python -m unirl.tools.bench --config-name=<domain>/<recipe>")
    for flag in ("--warmup", "--iters", "--json", "--peak-tflops", "--no-flops", "--profile"):
        assert f"  {flag}" in out, flag
    assert out.index("--profile") < out.index("== Configuration groups ==")  # then Hydra's
