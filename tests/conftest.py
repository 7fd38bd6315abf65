"""One local Ray runtime for the whole test session (init ~5 s, ~0.9 GB), on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ray_env import quiet_ray_env

os.environ.update(quiet_ray_env())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow`` alone skips a test unless ``UNIRL_SLOW=1`` (the marker's promise
    in pyproject.toml), so a slow test without its own ``skipif`` never lands in CI's run."""
    if os.environ.get("UNIRL_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: runs with UNIRL_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    os.environ.pop("RAY_ADDRESS", None)
    if not ray.is_initialized():
        ray.init(
            address="local",  # never a cluster `ray start` registered on this machine
            num_cpus=4,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
        )
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def fresh_output_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recipes default to ``${oc.env:OUTPUT_DIR,outputs/<recipe>}`` relative to the working
    directory; a user's earlier run there would make the fresh-run check refuse a recipe a
    test only validates. Each test gets its own empty folder (subprocesses inherit it)."""
    monkeypatch.setenv("OUTPUT_DIR", str(tmp_path_factory.mktemp("output") / "run"))
