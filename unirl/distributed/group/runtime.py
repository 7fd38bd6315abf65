"""Connecting the driver to Ray: reuse, join a cluster (``RAY_ADDRESS``) or start locally."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Literal

import ray

from unirl.distributed.group.reaper import children_of, start_reaper

RayMode = Literal["reused", "joined", "started"]
_REAPERS: list[subprocess.Popen[bytes]] = []  # kept so they are never collected as garbage


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
    - ``"started"``: start a local single-node Ray bound to 127.0.0.1 (``address="local"``:
      a cluster that ``ray start`` registered on this machine is never joined unasked), no
      dashboard, usage stats off, with ``num_cpus`` / ``num_gpus`` logical resources (``None``: detected).
      A reaper process (``reaper.py``) ends every process of that Ray session within about
      3 s once this process dies, SIGKILL included (Ray alone leaves agents for 1-2 min).
    """
    if ray.is_initialized():
        return "reused"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=log_to_driver)
        return "joined"
    linux = sys.platform.startswith("linux")
    before = children_of(os.getpid()) if linux else set()
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=log_to_driver,
    )
    if linux:
        _reap_after_driver(children_of(os.getpid()) - before)
    return "started"


def _reap_after_driver(roots: set[tuple[int, int]]) -> None:
    """Start the reaper over ``roots``, the processes ``ray.init`` just started (gcs_server,
    raylet, monitors, dashboard): their trees end when this process dies."""
    if not roots:
        return
    context = ray.get_runtime_context()
    logs = os.path.join(context.get_temp_dir(), context.get_session_name(), "logs")
    reaper = start_reaper(roots, os.path.join(logs, "unirl_reaper.log"))
    if reaper is not None:
        _REAPERS.append(reaper)
