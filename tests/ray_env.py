"""Environment for fast, quiet Ray in tests (a uniquely named module, importable anywhere)."""

from __future__ import annotations

import os
from pathlib import Path

# workers import the test role classes from here
ROLE_PATHS = [Path(__file__).resolve().parent / "distributed"]


def quiet_ray_env() -> dict[str, str]:
    """Ray env for tests; PYTHONPATH lets workers import the test roles."""
    paths = [
        *map(str, ROLE_PATHS),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }
