"""The benchmark CLI on the tiny preset (CPU): it runs, counts FLOPs and writes its JSON.

The JSON is kept as an artifact of the test run in ``outputs/ci-artifacts/bench_cpu.json``;
timings are recorded, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ARTIFACT = Path(__file__).resolve().parents[2] / "outputs" / "ci-artifacts" / "bench_cpu.json"


def test_bench_cli_on_tiny_cpu(tmp_path: Path) -> None:
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "unirl.tools.bench",
        "--config-name=diffusion/sd3_tiny_trainside",
        "--warmup",
        "1",
        "--iters",
        "2",
        "--json",
        str(ARTIFACT),
        f"output_dir={tmp_path / 'bench'}",
    ]
    env = {**os.environ, "RAY_ADDRESS": ""}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads(ARTIFACT.read_text())
    assert data["timed_rollouts"] == 2 and data["samples_per_rollout"] == 8
    assert data["samples_per_s"] > 0
    assert set(data["seconds_per_phase"]) >= {
        "text_encode",
        "rollout",
        "decode",
        "reward",
        "old_logp",
        "train",
        "sync",
    }
    flops = data["flops"]
    # counted, and consistent: the transformer is part of the rollout; training is all transformer
    assert 0 < flops["rollout_transformer"] < flops["rollout_total"]
    assert flops["train_total"] > 0 and flops["samples"] == 8
    assert data["peak_memory_gib"] == [0.0]  # CPU
    print(f"bench JSON kept at {ARTIFACT}: {data['samples_per_s']:.2f} samples/s")
