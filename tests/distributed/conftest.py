"""One local Ray runtime shared by every test in tests/distributed (init ~5 s, ~0.9 GB)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def quiet_ray_env() -> dict[str, str]:
    """Env for fast, quiet Ray in tests; PYTHONPATH lets workers import the test roles."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
    }


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    os.environ.update(quiet_ray_env())
    os.environ.pop("RAY_ADDRESS", None)
    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
        )
    yield
    ray.shutdown()
