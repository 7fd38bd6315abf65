"""Single controller on Ray: a driver holds ``Handle``s; ``Worker`` actors (one per device
slot) host roles side by side. See README.md in this directory.

The role-side vocabulary (``distributed``, ``Dispatch``, ``Remote``, ``RankInfo``,
``current_rank_info``, errors) imports without Ray or torch, so model and engine code can
mark methods cheaply; the Ray-backed names (``DevicePool``, ``placement``, ``remote``,
``Handle``, ...) load on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from unirl.distributed.group.dispatch import Dispatch, DistributedSpec, distributed
from unirl.distributed.group.errors import PlacementError, RemoteCallError, StalledCallError
from unirl.distributed.group.rank import ParallelSizes, RankInfo
from unirl.distributed.group.role import (
    Remote,
    current_process_group,
    current_rank_info,
    current_role,
)

if TYPE_CHECKING:
    from unirl.distributed.group.handle import Handle, PendingCall
    from unirl.distributed.group.layout import Slab, placement, remote
    from unirl.distributed.group.pool import (
        DevicePool,
        DevicePoolConfig,
        DryRunPool,
        PoolBase,
        describe_plan,
    )
    from unirl.distributed.group.runtime import ensure_ray
    from unirl.distributed.group.watchdog import StallPolicy
    from unirl.distributed.group.worker import Worker

_LAZY = {
    "DevicePool": "pool",
    "DevicePoolConfig": "pool",
    "DryRunPool": "pool",
    "PoolBase": "pool",
    "Handle": "handle",
    "PendingCall": "handle",
    "Slab": "layout",
    "placement": "layout",
    "remote": "layout",
    "describe_plan": "pool",
    "ensure_ray": "runtime",
    "StallPolicy": "watchdog",
    "Worker": "worker",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DevicePool",
    "DevicePoolConfig",
    "Dispatch",
    "DistributedSpec",
    "DryRunPool",
    "Handle",
    "ParallelSizes",
    "PendingCall",
    "PlacementError",
    "PoolBase",
    "RankInfo",
    "Remote",
    "RemoteCallError",
    "Slab",
    "StallPolicy",
    "StalledCallError",
    "Worker",
    "current_process_group",
    "current_rank_info",
    "current_role",
    "describe_plan",
    "distributed",
    "ensure_ray",
    "placement",
    "remote",
]
