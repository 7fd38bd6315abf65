"""Connecting the driver to Ray: reuse, join a cluster (``RAY_ADDRESS``) or start locally."""

from __future__ import annotations

import logging
import os
from typing import Literal

import ray

RayMode = Literal["reused", "joined", "started"]


def ensure_ray(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    log_to_driver: bool = True,
) -> RayMode:
    """Make sure this process is a Ray driver; returns how.

    - ``"reused"``: Ray was already initialised (tests, notebooks); nothing changes.
    - ``"joined"``: ``RAY_ADDRESS`` is set; connect to that cluster. ``num_cpus`` /
      ``num_gpus`` are ignored there (Ray raises if they are passed with an address).
    - ``"started"``: start a local single-node Ray bound to 127.0.0.1, no dashboard, usage
      stats off, with ``num_cpus`` / ``num_gpus`` logical resources (``None``: detected).
    """
    if ray.is_initialized():
        return "reused"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=log_to_driver)
        return "joined"
    ray.init(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=log_to_driver,
    )
    return "started"
