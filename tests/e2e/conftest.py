from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
        )
    yield
