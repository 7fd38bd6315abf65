"""``PoolConfig``: the device-pool knobs, declared once.

A recipe sets them at its top level (``num_devices: 2``, ``cpus_per_worker: 1``), so
``RunConfig`` derives this class; ``unirl.distributed.group.DevicePoolConfig`` derives it too
and adds what only the process that builds a pool decides (name, worker env, placement and
collective timeouts, log forwarding); ``DevicePool`` takes that config whole. The stall
bounds are their own class because the watchdog's ``StallPolicy`` derives them.

It lives in ``config`` rather than next to ``DevicePool`` because ``config`` is the bottom
layer: ``RunConfig`` may not import ``distributed`` (tests/architecture).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from unirl.config.require import require
from unirl.config.typecheck import NonNegativeInt, PositiveFloat, PositiveInt

DeviceKind = Literal["cpu", "cuda"]


@dataclass(kw_only=True)
class StallConfig:
    """When the driver declares a busy worker stalled (``None`` turns a bound off)."""

    heartbeat_timeout_s: PositiveFloat | None = 30.0
    """A busy worker silent to pings this long is frozen: the run fails (null: off)."""
    stall_factor: PositiveFloat | None = 4.0
    """A call past max(stall_floor_s, this x its method's longest earlier run) fails (null: off)."""
    stall_floor_s: PositiveFloat = 300.0
    """Least time any call may run before ``stall_factor`` can fail it."""

    def __post_init__(self) -> None:
        require(
            self.heartbeat_timeout_s is None or self.heartbeat_timeout_s > 0,
            f"heartbeat_timeout_s={self.heartbeat_timeout_s!r} must be > 0 or null (off)",
        )
        require(
            self.stall_factor is None or self.stall_factor >= 1,
            f"stall_factor={self.stall_factor!r} must be >= 1 or null (off); a call may take "
            "stall_factor x the longest earlier run of its method",
        )
        require(self.stall_floor_s > 0, f"stall_floor_s={self.stall_floor_s!r} must be > 0")


@dataclass(kw_only=True)
class PoolConfig(StallConfig):
    """Shape of the device pool. ``devices_per_node=None``: as many per node as the cluster
    allows. ``cpus_per_worker``: CPUs reserved per worker (also its torch threads); 0 is
    allowed on CUDA, where the bundle then reserves the GPU only. ``call_timeout_s``: the
    longest any remote call may take (null: no bound)."""

    num_devices: PositiveInt = 1
    """Workers in the pool: GPUs with ``device=cuda``, CPU processes with ``device=cpu``."""
    devices_per_node: PositiveInt | None = None
    device: DeviceKind = "cpu"
    """``cpu`` or ``cuda``: what every worker computes on."""
    cpus_per_worker: NonNegativeInt = 1
    call_timeout_s: PositiveFloat | None = 1800.0

    def __post_init__(self) -> None:
        require(
            isinstance(self.num_devices, int) and self.num_devices >= 1,
            f"num_devices={self.num_devices!r} must be an integer >= 1",
        )
        require(
            self.devices_per_node is None
            or (self.devices_per_node >= 1 and self.num_devices % self.devices_per_node == 0),
            f"devices_per_node={self.devices_per_node} must divide num_devices={self.num_devices}",
        )
        require(
            self.device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {self.device!r}"
        )
        least = 1 if self.device == "cpu" else 0
        require(
            isinstance(self.cpus_per_worker, int) and self.cpus_per_worker >= least,
            f"cpus_per_worker={self.cpus_per_worker!r} must be an integer >= {least} "
            f"with device={self.device}",
        )
        require(
            self.call_timeout_s is None or self.call_timeout_s > 0,
            f"call_timeout_s={self.call_timeout_s!r} must be > 0 or null",
        )
        super().__post_init__()


def fields_of(config: object, cls: type) -> dict[str, Any]:
    """``config``'s values of the fields ``cls`` declares (``config`` is a ``cls`` or derives
    it): how one config hands its share to another without listing the fields."""
    require(isinstance(config, cls), f"{type(config).__name__} is not a {cls.__name__}")
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if f.init}
