"""Helpers shared by the end-to-end tests (a module with a unique name: a bare
``from conftest import`` would pick whichever conftest pytest loaded last)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unirl.config.entry import compose_recipe


def run_recipe(name: str, overrides: list[str]) -> int:
    """Run a recipe in this process exactly as ``python -m unirl.train_diffusion`` does."""
    from unirl.train_diffusion import run

    return run(compose_recipe(name, overrides))


def read_metrics(output_dir: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    with (output_dir / name).open() as f:
        return [json.loads(line) for line in f if line.strip()]
