"""``SyncGroup``: a dedicated ``torch.distributed`` group for weight transfer.

It spans trainer rank 0 (sender, rank 0 here) and every rollout rank, and is built from its
own ``TCPStore`` — not from the default process group — so it can cross slabs whose
processes belong to different (or no) default groups, and so it never disturbs the trainer's
FSDP world. Collectives are called on the process-group object directly.
Backend: gloo for CPU tensors, NCCL for CUDA tensors (NCCL is GPU-only and untested here).
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch
import torch.distributed as dist

from unirl.distributed.weight_sync.manifest import WeightSyncError


def free_port() -> int:
    """A TCP port free on this host right now (for the group's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def node_address() -> str:
    """This node's address as Ray knows it (``127.0.0.1`` outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:  # pragma: no cover - ray is a core dependency
        pass
    return "127.0.0.1"


class SyncGroup:
    """Rank ``rank`` of a ``world_size`` group rendezvousing at ``host:port`` (rank 0 hosts
    the store). ``backend``: ``"gloo"`` or ``"nccl"``."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 600.0,
        name: str = "unirl_weight_sync",
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise WeightSyncError(f"SyncGroup backend must be 'gloo' or 'nccl', got {backend!r}")
        if not 0 <= rank < world_size:
            raise WeightSyncError(f"SyncGroup rank {rank} outside world of {world_size}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = torch.device("cpu")
        self._store: dist.TCPStore | None
        try:
            self._store = dist.TCPStore(
                host, port, world_size, is_master=(rank == 0), timeout=timeout
            )
        except Exception as exc:  # names the endpoint: the common failure is an unreachable host
            raise WeightSyncError(
                f"weight-sync group rank {rank}/{world_size}: cannot reach the store at {host}:{port} "
                f"within {timeout_s:g} s ({type(exc).__name__}: {exc})"
            ) from exc
        store = dist.PrefixStore(name, self._store)
        if backend == "gloo":
            self.pg: Any = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        else:
            nccl = getattr(dist, "ProcessGroupNCCL", None)
            if nccl is None or not torch.cuda.is_available():
                raise WeightSyncError(
                    "weight-sync backend nccl needs a CUDA build of torch and a visible GPU; "
                    "on CPU the sync group uses gloo"
                )
            options = nccl.Options()
            options._timeout = timeout
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.pg = nccl(store, rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """In-place broadcast of ``tensor`` from group rank ``src``."""
        options = dist.BroadcastOptions()
        options.rootRank = src
        options.rootTensor = 0
        self.pg.broadcast([tensor], options).wait()

    def barrier(self) -> None:
        """Every rank reaches this point (a one-byte broadcast: works for gloo and NCCL)."""
        self.broadcast(torch.zeros(1, dtype=torch.uint8, device=self.device))

    def close(self) -> None:
        self.pg = None
        self._store = None
