"""The wheel is enough: built from a copy of the source, installed into a fresh venv, it runs
the text quick-start by its console script from a folder far from any clone (the recipes and
the datasets are inside the wheel), and its export script writes the model plain transformers
loads. The venv sees the machine's site-packages (``--system-site-packages``) so torch is not
installed again; the test checks that ``unirl`` itself comes from the venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "unirl-train-diffusion",
    "unirl-train-vlm",
    "unirl-train-pe",
    "unirl-train-unified-model",
    "unirl-export",
    "unirl-port-recipe",
    "unirl-bench",
}
COPY_IGNORE = shutil.ignore_patterns(
    ".git", "outputs", "build", "dist", "site", "__pycache__", "*.egg-info", ".*_cache"
)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{cmd[:3]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_the_wheel_in_a_fresh_venv_runs_the_quick_start_and_exports(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUTPUT_DIR")}
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=COPY_IGNORE)
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(source), "-w", str(dist)],
        tmp_path,
        env,
    )  # fmt: skip
    (wheel,) = dist.glob("unirl_mm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    for name in (
        "unirl/_bundled/examples/llm/qwen3_tiny_grpo.yaml",
        "unirl/_bundled/examples/diffusion/sd3_tiny_trainside.yaml",
        "unirl/_bundled/datasets/arithmetic/easy.jsonl",
        "unirl/_bundled/datasets/geometry/train.jsonl",
        "unirl/logging/report.html.j2",
    ):
        assert name in names, name
    assert {line.split(" = ")[0] for line in scripts.splitlines() if " = " in line} == SCRIPTS

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path, env)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], tmp_path, env)  # fmt: skip
    shutil.rmtree(source)  # nothing of the clone's copy is left to fall back on
    where = _run([str(python), "-c", "import unirl; print(unirl.__file__)"], tmp_path, env)
    assert where.strip().startswith(str(venv)), where

    out = tmp_path / "run"
    overrides = ["num_rollouts=2", "eval_interval=0", "logging.gallery_interval=0"]
    _run([str(bin_dir / "unirl-train-vlm"), "--config-name=llm/qwen3_tiny_grpo", f"output_dir={out}", *overrides], tmp_path, env)  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    config = (out / "config.yaml").read_text()
    assert f"path: {venv}" in config  # the dataset the wheel ships
    assert (out / "report.html").is_file()

    exported = tmp_path / "exported"
    _run([str(bin_dir / "unirl-export"), str(out), "--out", str(exported)], tmp_path, env)
    assert {"README.md", "config.json", "model.safetensors"} <= {p.name for p in exported.iterdir()}
