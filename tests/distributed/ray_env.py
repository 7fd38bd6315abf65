"""Test Ray environment (a uniquely named module: importable from test files and conftest)."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def quiet_ray_env() -> dict[str, str]:
    """Env for fast, quiet Ray in tests; PYTHONPATH lets workers import the test roles."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }
