"""Printable placement plan: pool shape, roles -> worker ranks -> node ip / device."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unirl.distributed.group.pool import PoolBase


def _ranges(ranks: tuple[int, ...]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def format_plan(pool: PoolBase) -> str:
    """The plan as text, one line per worker of each role, e.g.::

    DevicePool 'unirl': 4 x cpu on 2 node(s), bundle {'CPU': 1.0}
      role 'trainer'  pool ranks 0-1  dp=2 tp=1 pp=1 sp=1 ep=1
        rank 0 -> worker 0  node 0 (10.0.0.1)  local 0  cpu
    """
    c = pool.config
    nodes = len({info.node_rank for info in pool.rank_infos})
    lines = [
        f"DevicePool '{c.name}': {c.num_devices} x {c.device} on {nodes} node(s), bundle {c.bundle}"
    ]
    for name, handle in pool.roles.items():
        first = handle.rank_infos[0]
        lines.append(
            f"  role '{name}'  pool ranks {_ranges(handle.pool_ranks)}  dp={first.dp_size} "
            f"tp={first.tp_size} pp={first.pp_size} sp={first.sp_size} ep={first.ep_size}"
        )
        for info in handle.rank_infos:
            worker = info.pool_rank
            lines.append(
                f"    rank {info.rank} -> worker {worker}  node {info.node_rank} "
                f"({pool.node_ips[worker]})  local {info.local_rank}  "
                f"{pool.device_labels[worker]}"
            )
    claimed = {r for handle in pool.roles.values() for r in handle.pool_ranks}
    idle = [r for r in range(c.num_devices) if r not in claimed]
    if idle:
        lines.append(f"  idle workers: {_ranges(tuple(idle))}")
    return "\n".join(lines)


def describe_plan(pool: PoolBase) -> str:
    """Same as ``pool.describe_plan()``."""
    return format_plan(pool)
