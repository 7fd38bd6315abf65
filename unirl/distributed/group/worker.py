"""``Worker``: one Ray actor per device slot, hosting several roles in one Python process.

The class is plain Python; ``DevicePool`` turns it into an actor with ``ray.remote(Worker)``
and pins each instance to one placement-group bundle. Siblings on a worker share objects
(and CUDA memory) because they live in the same process.

Threads: ``heartbeat`` runs in its own Ray concurrency group (``watchdog.HEARTBEAT_GROUP``),
so every other method, role calls included, runs one at a time on one worker thread (not
the process's main thread); ``__init__`` runs on the main thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import time
import traceback
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, NotRequired, TypedDict

import torch

from unirl.distributed.group.dispatch import DistributedSpec, collect_specs
from unirl.distributed.group.errors import RoleFailure
from unirl.distributed.group.rank import RankInfo
from unirl.distributed.group.role import ROLE_ATTR, RoleContext, RoleSpec, role_scope, set_worker
from unirl.distributed.group.watchdog import Beat

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

WORLD_GROUP = "world"


class WorkerInfo(TypedDict):
    """Where one worker runs (``Worker.node_info``; the driver adds ``node_ip``)."""

    node_id: str
    actor_id: str | None
    pid: int
    gpu_ids: list[str]  # Ray's physical ids
    node_ip: NotRequired[str]


@contextlib.contextmanager
def _as_role_failure() -> Iterator[None]:
    """Re-raise any exception from role code as a ``RoleFailure`` with its traceback text."""
    try:
        yield
    except Exception as exc:
        raise RoleFailure(type(exc).__name__, str(exc), traceback.format_exc()) from None


@dataclasses.dataclass(frozen=True)
class _Running:
    role: str
    method: str
    started: float
    bounded: bool


class Worker:
    """Hosts roles by name; the driver reaches it only through Ray actor calls."""

    def __init__(self, rank_info: RankInfo, *, device: str, cpus_per_worker: int) -> None:
        self.rank_info = rank_info
        self.device = device
        self._roles: dict[str, object] = {}
        self._contexts: dict[str, RoleContext] = {}
        self._specs: dict[str, dict[str, DistributedSpec]] = {}
        self._groups: dict[tuple[int, ...], ProcessGroup] = {}
        self._group_names: dict[str, tuple[int, ...]] = {}
        self._running: _Running | None = None  # read by heartbeat() on its own thread
        self._longest: dict[tuple[str, str], float] = {}  # (role, method) -> longest run, s
        if device == "cpu":
            torch.set_num_threads(max(1, cpus_per_worker))
        else:
            # Ray sets CUDA_VISIBLE_DEVICES to this actor's one GPU, so it is cuda:0 here.
            if torch.cuda.device_count() != 1:
                raise RuntimeError(
                    f"worker rank {rank_info.rank} sees {torch.cuda.device_count()} GPUs "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                    "expected exactly the one Ray assigned to it"
                )
            torch.cuda.set_device(0)
        set_worker(self)

    # ---- control -------------------------------------------------------------------------

    def ping(self) -> int:
        """Returns the pool rank (liveness check; queued behind a running call)."""
        return self.rank_info.rank

    def heartbeat(self) -> Beat:
        """The pid and the call running now (called in ``HEARTBEAT_GROUP``, on its own
        thread, so it answers during a long call; a frozen process answers nothing)."""
        running = self._running  # one read: the call thread replaces it
        if running is None:
            return Beat(pid=os.getpid())
        return Beat(
            pid=os.getpid(),
            role=running.role,
            method=running.method,
            running_s=time.monotonic() - running.started,
            longest_s=self._longest.get((running.role, running.method)),
            bounded=running.bounded,
        )

    @contextlib.contextmanager
    def _tracked(self, role: str, method: str, *, bounded: bool) -> Iterator[None]:
        """Publish the running call to ``heartbeat``; record its duration when it ends."""
        started = time.monotonic()
        self._running = _Running(role, method, started, bounded)
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            key = (role, method)
            self._longest[key] = max(elapsed, self._longest.get(key, 0.0))
            self._running = None

    def node_info(self) -> WorkerInfo:
        """``node_id``, ``actor_id``, ``pid``, ``gpu_ids`` (Ray's physical ids) of this worker.

        The node ip is looked up by the driver from ``ray.nodes()`` (the address Ray itself
        uses for the node), not from the host's interfaces.
        """
        import ray

        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "actor_id": context.get_actor_id(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self) -> int:
        """A TCP port free right now on this node (for ``MASTER_PORT``)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def set_env(self, env: Mapping[str, str]) -> None:
        os.environ.update({k: str(v) for k, v in env.items()})

    # ---- roles ---------------------------------------------------------------------------

    def create_role(
        self,
        name: str,
        spec: RoleSpec,
        kwargs: dict[str, object],
        siblings: dict[str, str],
        context: RoleContext,
    ) -> dict[str, DistributedSpec]:
        """Build role ``name`` from a ``_target_`` config or a class/factory.

        ``siblings`` maps constructor kwarg -> role name on this worker; those kwargs receive
        the local instance. Returns the role's ``@distributed`` methods.
        """
        if name in self._roles:
            raise ValueError(f"role '{name}' already exists on worker {self.rank_info.rank}")
        missing = [r for r in siblings.values() if r not in self._roles]
        if missing:
            raise ValueError(
                f"role '{name}': sibling role(s) {missing} are not on worker "
                f"{self.rank_info.rank} (it hosts {sorted(self._roles)})"
            )
        call_kwargs = dict(kwargs)
        call_kwargs.update({kw: self._roles[role] for kw, role in siblings.items()})
        with (
            self._tracked(name, "__init__", bounded=False),
            role_scope(context),
            _as_role_failure(),
        ):
            if isinstance(spec, Mapping):
                from hydra.utils import instantiate

                # _partial_ then call: hydra treats dataclass instances passed as instantiate
                # kwargs as configs and copies them, which would break sibling sharing.
                factory = instantiate(dict(spec), _convert_="object", _partial_=True)
                instance = factory(**call_kwargs)
            else:
                instance = spec(**call_kwargs)
        # Slotted/builtin objects refuse the attribute; current_rank_info() still works for
        # them inside calls, and Remote subclasses always accept it.
        with contextlib.suppress(AttributeError, TypeError):
            object.__setattr__(instance, ROLE_ATTR, context)
        self._roles[name] = instance
        self._contexts[name] = context
        self._specs[name] = collect_specs(type(instance))
        return self._specs[name]

    def call(
        self,
        role: str,
        method: str,
        payload: tuple[tuple[object, ...], dict[str, object]],
        bounded: bool = True,
    ) -> object:
        """Run ``role.method(*args, **kwargs)`` with the role's context current.

        ``bounded``: the driver applies the measured stall bound to this call (it has no
        explicit timeout); ``heartbeat`` reports it.
        """
        instance = self._roles.get(role)
        if instance is None:
            raise KeyError(
                f"no role '{role}' on worker {self.rank_info.rank} (has {sorted(self._roles)})"
            )
        if method not in self._specs[role]:
            raise AttributeError(
                f"role '{role}' ({type(instance).__name__}) has no @distributed method '{method}'"
            )
        args, kwargs = payload
        with (
            self._tracked(role, method, bounded=bounded),
            role_scope(self._contexts[role]),
            _as_role_failure(),
        ):
            return getattr(instance, method)(*args, **kwargs)

    def drop_role(self, role: str) -> None:
        self._roles.pop(role, None)
        self._contexts.pop(role, None)
        self._specs.pop(role, None)

    # ---- torch.distributed ---------------------------------------------------------------

    def init_process_group(
        self, group_name: str, ranks: list[int], backend: str, timeout_s: float
    ) -> float:
        """Join a ``torch.distributed`` group; returns seconds spent.

        ``group_name == "world"`` initialises the default group over every pool worker (all
        must call at once, env:// rendezvous at MASTER_ADDR:MASTER_PORT). Any other name
        creates a subgroup over the pool ``ranks`` (only members call; needs the world group).
        """
        with self._tracked(f"<group {group_name}>", "init_process_group", bounded=False):
            return self._join_group(group_name, ranks, backend, timeout_s)

    def _join_group(
        self, group_name: str, ranks: list[int], backend: str, timeout_s: float
    ) -> float:
        import torch.distributed as dist

        start = time.monotonic()
        timeout = datetime.timedelta(seconds=timeout_s)
        key = tuple(sorted(ranks))
        if group_name == WORLD_GROUP:
            if not dist.is_initialized():
                dist.init_process_group(
                    backend=backend,
                    init_method="env://",
                    rank=self.rank_info.rank,
                    world_size=self.rank_info.world_size,
                    timeout=timeout,
                )
            world = dist.group.WORLD
            if world is None:
                raise RuntimeError(
                    f"worker {self.rank_info.rank}: no world process group after init"
                )
            self._groups[key] = world
        elif key not in self._groups:
            if not dist.is_initialized():
                raise RuntimeError(
                    f"group '{group_name}': the world process group is not initialised on "
                    f"worker {self.rank_info.rank}; the driver initialises it first"
                )
            if self.rank_info.rank not in key:
                raise ValueError(
                    f"group '{group_name}' ranks {list(key)} do not include worker "
                    f"{self.rank_info.rank}"
                )
            self._groups[key] = dist.new_group(
                ranks=list(key), backend=backend, timeout=timeout, use_local_synchronization=True
            )
        self._group_names[group_name] = key
        return time.monotonic() - start

    def process_group_for(self, pool_ranks: tuple[int, ...]) -> ProcessGroup:
        """The group over exactly ``pool_ranks``; raises if the driver has not created it."""
        group = self._groups.get(tuple(sorted(pool_ranks)))
        if group is None:
            raise RuntimeError(
                f"no process group over pool ranks {list(pool_ranks)} on worker "
                f"{self.rank_info.rank}; call handle.init_process_group() from the driver first"
            )
        return group
