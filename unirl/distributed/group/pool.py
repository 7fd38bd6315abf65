"""``DevicePool``: placement groups + one ``Worker`` actor per device slot; ``DryRunPool``:
the same layout arithmetic with no Ray, for ``dry_run`` plans; ``describe_plan``: the
printable plan of either (pool shape, roles -> worker ranks -> node ip / device). Both take a
``DevicePoolConfig`` whole (the recipe's pool knobs, ``unirl.config.pool.PoolConfig``, plus
the process-side fields)."""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, cast

import ray
import ray.exceptions as rex

from unirl.config import require
from unirl.config.pool import PoolConfig, fields_of
from unirl.distributed.group.dispatch import Dispatch, DistributedSpec
from unirl.distributed.group.errors import PlacementError
from unirl.distributed.group.handle import Handle, PendingCall, RankCall, wait_all
from unirl.distributed.group.layout import Slab
from unirl.distributed.group.rank import ParallelSizes, RankInfo, pool_rank_infos, slab_rank_infos
from unirl.distributed.group.role import RoleContext, RoleSpec
from unirl.distributed.group.runtime import ensure_ray
from unirl.distributed.group.watchdog import HEARTBEAT_GROUP, StallPolicy
from unirl.distributed.group.worker import WORLD_GROUP, Worker, WorkerInfo

if TYPE_CHECKING:
    from ray.actor import ActorHandle
    from ray.util.placement_group import PlacementGroup


@dataclass(kw_only=True)
class DevicePoolConfig(PoolConfig):
    """Everything a pool is built from: the knobs of :class:`~unirl.config.pool.PoolConfig`
    (a recipe's top level; :meth:`of` takes them from a ``RunConfig``) plus what only the
    process that builds the pool decides: its ``name`` (actor and placement-group names),
    worker ``env``, how long placement and a collective rendezvous may take, and whether
    worker output reaches the driver. ``stall_policy``: the watchdog's view of the stall
    bounds (``watchdog.StallPolicy``).
    """

    name: str = "unirl"
    env: dict[str, str] = field(default_factory=dict)
    placement_timeout_s: float = 120.0
    collective_timeout_s: float = 1800.0
    log_to_driver: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("placement_timeout_s", "collective_timeout_s"):
            require(getattr(self, key) > 0, f"DevicePool {key}={getattr(self, key)!r}: must be > 0")

    @classmethod
    def of(cls, pool: PoolConfig, **process: object) -> DevicePoolConfig:
        """The config of a run's pool: ``pool``'s knobs (a ``RunConfig`` is a ``PoolConfig``)
        and the process-side fields in ``process`` (``name``, ``log_to_driver``, ...; a pool
        knob given there replaces ``pool``'s)."""
        return cls(**{**fields_of(pool, PoolConfig), **process})

    @property
    def stall_policy(self) -> StallPolicy:
        return StallPolicy.of(self)

    @property
    def bundle(self) -> dict[str, float]:
        """Resources of one device slot (one placement-group bundle)."""
        if self.device == "cpu":
            return {"CPU": float(self.cpus_per_worker)}
        bundle = {"GPU": 1.0}
        if self.cpus_per_worker:
            bundle["CPU"] = float(self.cpus_per_worker)
        return bundle


def _ranges(ranks: tuple[int, ...]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def describe_plan(pool: PoolBase) -> str:
    """Same as ``pool.describe_plan()``."""
    return pool.describe_plan()


def role_target(spec: RoleSpec, kwargs: dict[str, object] | None = None) -> str:
    """What a role runs, as a dotted name: a block's ``_target_`` or a class's path, then the
    blocks it is given to build (``RewardWorker (service=unirl.reward.RewardService)``)."""
    if isinstance(spec, dict):
        return str(spec.get("_target_", "?"))
    name = f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"
    blocks = [
        f"{key}={value['_target_']}"
        for key, value in (kwargs or {}).items()
        if isinstance(value, dict) and "_target_" in value
    ]
    return f"{name} ({', '.join(blocks)})" if blocks else name


class PoolBase:
    """Layout shared by the real and the dry-run pool: ranks, nodes, roles, the plan.

    ``plans_only``: true for :class:`DryRunPool`; placement code that calls a role while it
    places (a world rendezvous, putting an engine to sleep) skips those calls there."""

    plans_only = False

    def __init__(self, config: DevicePoolConfig) -> None:
        require(
            isinstance(config, DevicePoolConfig),
            f"{type(self).__name__} takes its DevicePoolConfig whole, e.g. "
            f"{type(self).__name__}(DevicePoolConfig(num_devices=2, device='cpu')) or "
            f"DevicePoolConfig.of(run_config); got {config!r}",
        )
        self.config = config
        self.rank_infos: list[RankInfo] = []
        self.node_ips: list[str] = []
        self.device_labels: list[str] = []
        self.roles: dict[str, Handle] = {}
        self.role_targets: dict[str, str] = {}  # role -> what it runs (role_target)
        self.process_groups: list[tuple[str, tuple[int, ...]]] = []  # (name, pool ranks)
        self.root_slab = Slab(pool=self, ranks=tuple(range(config.num_devices)))
        self.stall_policy = config.stall_policy
        self._closed = False

    @property
    def num_devices(self) -> int:
        return self.config.num_devices

    @property
    def call_timeout_s(self) -> float | None:
        return self.config.call_timeout_s

    @property
    def closed(self) -> bool:
        return self._closed

    def unique_role_name(self, base: str) -> str:
        name, index = base, 1
        while name in self.roles:
            index += 1
            name = f"{base}_{index}"
        return name

    def describe_plan(self) -> str:
        """The plan as text, one line per worker of each role, e.g.::

        DevicePool 'unirl': 4 x cpu on 2 node(s), bundle {'CPU': 1.0}
          role 'trainer'  pool ranks 0-1  dp=2 tp=1 pp=1 sp=1 ep=1
            rank 0 -> worker 0  node 0 (10.0.0.1)  local 0  cpu
        """
        c = self.config
        nodes = len({info.node_rank for info in self.rank_infos})
        lines = [
            f"DevicePool '{c.name}': {c.num_devices} x {c.device} on {nodes} node(s), "
            f"bundle {c.bundle}"
        ]
        for name, handle in self.roles.items():
            first = handle.rank_infos[0]
            lines.append(
                f"  role '{name}'  pool ranks {_ranges(handle.pool_ranks)}  dp={first.dp_size} "
                f"tp={first.tp_size} pp={first.pp_size} sp={first.sp_size} ep={first.ep_size}"
            )
            for info in handle.rank_infos:
                worker = info.pool_rank
                lines.append(
                    f"    rank {info.rank} -> worker {worker}  node {info.node_rank} "
                    f"({self.node_ips[worker]})  local {info.local_rank}  "
                    f"{self.device_labels[worker]}"
                )
        claimed = {r for handle in self.roles.values() for r in handle.pool_ranks}
        idle = [r for r in range(c.num_devices) if r not in claimed]
        if idle:
            lines.append(f"  idle workers: {_ranges(tuple(idle))}")
        return "\n".join(lines)

    def plan_rows(self) -> list[tuple[str, str, str]]:
        """``(role, what it runs, where)`` in creation order: the placement plan ``dry_run``
        prints and the real run prints when its roles are up (the same text for the same
        recipe, both made by the trainer's ``place_roles``). ``where``: pool ranks and the
        parallel sizes; process groups come as ``(group, "torch.distributed", ranks)``."""
        rows = [
            (f"group:{name}", "torch.distributed", f"pool ranks {_ranges(ranks)}")
            for name, ranks in self.process_groups
        ]
        for name, handle in self.roles.items():
            first = handle.rank_infos[0]
            sizes = f"dp={first.dp_size}" + "".join(
                f" {k}={v}"
                for k, v in (("tp", first.tp_size), ("pp", first.pp_size), ("sp", first.sp_size))
                if v > 1
            )
            if first.sp_size > 1:  # the workers that split one data-parallel rank's sequences
                groups: dict[tuple[int, int], list[int]] = {}
                for info in handle.rank_infos:
                    groups.setdefault((info.pp_rank, info.dp_rank), []).append(info.pool_rank)
                sizes += ", SP groups (pool ranks) " + ", ".join(
                    f"[{', '.join(map(str, g))}]" for g in groups.values()
                )
            rows.append(
                (
                    name,
                    self.role_targets.get(name, "?"),
                    f"pool ranks {_ranges(handle.pool_ranks)} {sizes}",
                )
            )
        return rows

    def create_role(
        self,
        name: str,
        spec: RoleSpec,
        kwargs: dict[str, object],
        siblings: dict[str, str],
        pool_ranks: tuple[int, ...],
        parallel: ParallelSizes,
    ) -> Handle:
        raise NotImplementedError

    def submit(self, pool_rank: int, method: str, *args: object) -> ray.ObjectRef:
        raise NotImplementedError

    def heartbeat(self, pool_rank: int) -> ray.ObjectRef:
        """Ping worker ``pool_rank`` on its heartbeat thread (a ``watchdog.Beat`` lands)."""
        raise NotImplementedError

    def worker_pid(self, pool_rank: int) -> int | None:
        return None

    def init_process_group(
        self, pool_ranks: tuple[int, ...], *, group_name: str, timeout_s: float | None = None
    ) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        self._closed = True

    def __enter__(self) -> PoolBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class DryRunPool(PoolBase):
    """A pool that only plans: ``placement``/``remote`` record roles and process groups,
    nothing runs.

    Nodes are assumed full (``devices_per_node`` each, default all on one node); node ips
    show as ``node<k>``. Handles from it raise on any call.
    """

    plans_only = True

    def __init__(self, config: DevicePoolConfig) -> None:
        super().__init__(config)
        per_node = config.devices_per_node or config.num_devices
        self.rank_infos = pool_rank_infos([r // per_node for r in range(config.num_devices)])
        self.node_ips = [f"node{info.node_rank}" for info in self.rank_infos]
        self.device_labels = [
            "cpu" if config.device == "cpu" else f"cuda (slot {info.local_rank})"
            for info in self.rank_infos
        ]

    def create_role(self, name, spec, kwargs, siblings, pool_ranks, parallel) -> Handle:  # type: ignore[no-untyped-def]
        infos = slab_rank_infos([self.rank_infos[r] for r in pool_ranks], parallel)
        handle = Handle(pool=self, role=name, pool_ranks=pool_ranks, rank_infos=infos, specs={})
        self.roles[name] = handle
        self.role_targets[name] = role_target(spec, kwargs)
        return handle

    def submit(self, pool_rank: int, method: str, *args: object) -> ray.ObjectRef:
        raise RuntimeError(f"DryRunPool '{self.config.name}' only plans; nothing can be called")

    def init_process_group(self, pool_ranks, *, group_name, timeout_s=None) -> None:  # type: ignore[no-untyped-def]
        """Recorded in the plan (``process_groups``); nothing starts."""
        self.process_groups.append((group_name, tuple(pool_ranks)))


class _RayNode(TypedDict, total=False):
    """The keys of a ``ray.nodes()`` entry read here."""

    NodeID: str
    Alive: bool
    NodeManagerAddress: str
    Resources: dict[str, float]


def _node_capacity(node: _RayNode, config: DevicePoolConfig) -> int:
    resources = node.get("Resources", {})
    cpus = resources.get("CPU", 0.0)
    by_cpu = math.floor(cpus / config.cpus_per_worker) if config.cpus_per_worker else math.inf
    if config.device == "cpu":
        return int(by_cpu)
    return int(min(math.floor(resources.get("GPU", 0.0)), by_cpu))


class DevicePool(PoolBase):
    """``num_devices`` device slots on Ray, one ``Worker`` actor each.

    One ``STRICT_PACK`` placement group per node of ``devices_per_node`` bundles
    (``{"CPU": cpus_per_worker}`` on CPU; ``{"GPU": 1, "CPU": cpus_per_worker}`` on CUDA, the
    CPU part dropped when ``cpus_per_worker=0``). Workers get pool RankInfos (node/local
    ranks from where Ray actually put each bundle) and the ``torch.distributed`` env
    (``MASTER_ADDR`` = rank 0's node ip, ``MASTER_PORT`` free there). Built from one
    ``DevicePoolConfig`` taken whole (``DevicePool(DevicePoolConfig(num_devices=4))``; a run:
    ``DevicePoolConfig.of(run_config)``). Use as a context manager or call ``shutdown()``.
    """

    def __init__(self, config: DevicePoolConfig) -> None:
        super().__init__(config)
        self._uid = uuid.uuid4().hex[:8]
        self._placement_groups: list[PlacementGroup] = []
        self._actors: list[ActorHandle] = []
        self._world_ready = False
        self.worker_info: list[WorkerInfo] = []
        needed_cpus = config.num_devices * config.cpus_per_worker
        ensure_ray(
            num_cpus=max(os.cpu_count() or 1, needed_cpus), log_to_driver=config.log_to_driver
        )
        try:
            self._place()
            self._spawn()
        except BaseException:
            self.shutdown()
            raise

    # ---- construction --------------------------------------------------------------------

    def _cluster_summary(self, nodes: list[_RayNode]) -> str:
        rows = []
        for node in nodes:
            res = node.get("Resources", {})
            rows.append(
                f"{node.get('NodeManagerAddress', '?')} CPU={res.get('CPU', 0):g} "
                f"GPU={res.get('GPU', 0):g} -> fits {_node_capacity(node, self.config)}"
            )
        return f"{len(nodes)} alive node(s): " + "; ".join(rows)

    def _ask(self, per_node: int) -> str:
        c = self.config
        return (
            f"DevicePool '{c.name}' asks for {c.num_devices} {c.device} device(s) as "
            f"{c.num_devices // per_node} node(s) x {per_node} (bundle {c.bundle})"
        )

    def _place(self) -> None:
        from ray.util.placement_group import placement_group, placement_group_table

        c = self.config
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        capacities = [_node_capacity(n, c) for n in nodes]
        per_node = c.devices_per_node
        if per_node is None:
            largest = max(capacities, default=0)
            fits = [d for d in range(1, min(largest, c.num_devices) + 1) if c.num_devices % d == 0]
            per_node = max(fits) if fits else c.num_devices
        num_groups = c.num_devices // per_node
        slots = sum(cap // per_node for cap in capacities)
        if slots < num_groups:
            raise PlacementError(
                f"{self._ask(per_node)}, but the cluster can host only {slots} such node "
                f"group(s): {self._cluster_summary(nodes)}. Lower num_devices / "
                "devices_per_node / cpus_per_worker, or join a bigger cluster via RAY_ADDRESS."
            )
        for index in range(num_groups):
            self._placement_groups.append(
                placement_group(
                    [dict(c.bundle) for _ in range(per_node)],
                    strategy="STRICT_PACK",
                    name=f"{c.name}-node{index}-{self._uid}",
                )
            )
        try:
            ray.get([pg.ready() for pg in self._placement_groups], timeout=c.placement_timeout_s)
        except rex.GetTimeoutError as err:
            raise PlacementError(
                f"{self._ask(per_node)}; the placement groups were not ready after "
                f"{c.placement_timeout_s:g} s (resources busy?). Cluster: "
                f"{self._cluster_summary(nodes)}; available now: {ray.available_resources()}"
            ) from err
        node_order: dict[str, int] = {}
        node_of_slot = []
        for pg in self._placement_groups:
            table = placement_group_table(pg)
            for bundle_index in range(per_node):
                node_id = table["bundles_to_node_id"][bundle_index]
                node_of_slot.append(node_order.setdefault(node_id, len(node_order)))
        self.rank_infos = pool_rank_infos(node_of_slot)
        self._per_node = per_node

    def _spawn(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = self.config
        # a second concurrency group: heartbeat() answers while a role call runs (Ray's
        # typed overloads of ray.remote omit concurrency_groups)
        groups = {HEARTBEAT_GROUP: 1}
        actor_cls = ray.remote(concurrency_groups=groups)(Worker)  # type: ignore[call-overload]
        runtime_env = {"env_vars": dict(c.env)} if c.env else None
        for info in self.rank_infos:
            pg = self._placement_groups[info.rank // self._per_node]
            options: dict[str, object] = {
                "num_cpus": c.cpus_per_worker,
                "num_gpus": 1 if c.device == "cuda" else 0,
                "name": f"{c.name}-worker{info.rank}-{self._uid}",
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg,
                    placement_group_bundle_index=info.rank % self._per_node,
                ),
            }
            if runtime_env:
                options["runtime_env"] = runtime_env
            self._actors.append(
                actor_cls.options(**options).remote(
                    info, device=c.device, cpus_per_worker=c.cpus_per_worker
                )
            )
        ranks = tuple(range(c.num_devices))
        infos = self._control("node_info", ranks, timeout_s=c.placement_timeout_s)
        self.worker_info = cast(list[WorkerInfo], infos)
        address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        for worker in self.worker_info:
            worker["node_ip"] = address[worker["node_id"]]
        self.node_ips = [w["node_ip"] for w in self.worker_info]
        self.device_labels = [
            "cpu" if c.device == "cpu" else f"cuda:0 (GPU {','.join(w['gpu_ids'])})"
            for w in self.worker_info
        ]
        port = self._control("free_port", (0,), timeout_s=c.placement_timeout_s)[0]
        master = {"MASTER_ADDR": self.node_ips[0], "MASTER_PORT": str(port)}
        refs = [
            self.submit(r, "set_env", {**self.rank_infos[r].torch_env(), **master}) for r in ranks
        ]
        self._wait_control("set_env", ranks, refs, timeout_s=c.placement_timeout_s)

    # ---- calls ---------------------------------------------------------------------------

    def actor(self, pool_rank: int) -> ActorHandle:
        """The Ray actor handle of worker ``pool_rank`` (for tools such as weight sync)."""
        return self._actors[pool_rank]

    def submit(self, pool_rank: int, method: str, *args: object) -> ray.ObjectRef:
        if self._closed:
            raise RuntimeError(f"DevicePool '{self.config.name}' is shut down")
        return getattr(self._actors[pool_rank], method).remote(*args)

    def heartbeat(self, pool_rank: int) -> ray.ObjectRef:
        actor = self._actors[pool_rank]
        return actor.heartbeat.options(concurrency_group=HEARTBEAT_GROUP).remote()

    def worker_pid(self, pool_rank: int) -> int | None:
        if pool_rank < len(self.worker_info):
            return self.worker_info[pool_rank].get("pid")
        return None

    def _wait_control(
        self,
        method: str,
        ranks: tuple[int, ...],
        refs: list[ray.ObjectRef],
        *,
        timeout_s: float | None,
    ) -> list[object]:
        pending = PendingCall(
            role=f"<pool {self.config.name}>",
            method=method,
            dispatch=Dispatch.BROADCAST,
            calls=[RankCall(rank=r, pool_rank=r, ref=ref) for r, ref in zip(ranks, refs)],
            timeout_s=timeout_s,
            node_ips=self.node_ips or ["?"] * self.config.num_devices,
            # no stall watchdog before every worker has answered node_info: an actor still
            # starting (imports, CUDA init) cannot answer pings; placement_timeout_s bounds it
            pool=self if self.worker_info else None,
        )
        return cast(list[object], wait_all([pending])[0])  # BROADCAST: one value per rank

    def _control(
        self, method: str, ranks: tuple[int, ...], *args: object, timeout_s: float | None
    ) -> list[object]:
        """Call Worker ``method`` on pool ``ranks`` and wait (failures -> RemoteCallError)."""
        refs = [self.submit(r, method, *args) for r in ranks]
        return self._wait_control(method, ranks, refs, timeout_s=timeout_s)

    def ping(self, timeout_s: float = 30.0) -> list[int]:
        """Pool ranks of live workers (raises ``RemoteCallError`` naming a dead/stuck one)."""
        ranks = self._control("ping", tuple(range(self.num_devices)), timeout_s=timeout_s)
        return cast(list[int], ranks)

    def create_role(self, name, spec, kwargs, siblings, pool_ranks, parallel) -> Handle:  # type: ignore[no-untyped-def]
        infos = slab_rank_infos([self.rank_infos[r] for r in pool_ranks], parallel)
        refs = [
            self.submit(
                pool_rank,
                "create_role",
                name,
                spec,
                kwargs,
                siblings,
                RoleContext(name=name, rank_info=info, pool_ranks=tuple(pool_ranks)),
            )
            for pool_rank, info in zip(pool_ranks, infos)
        ]
        pending = PendingCall(
            role=name,
            method="__init__",
            dispatch=Dispatch.BROADCAST,
            calls=[
                RankCall(rank=i, pool_rank=p, ref=ref)
                for i, (p, ref) in enumerate(zip(pool_ranks, refs))
            ],
            timeout_s=self.call_timeout_s,
            node_ips=self.node_ips,
            pool=self,
        )
        try:
            specs = cast(list[dict[str, DistributedSpec]], wait_all([pending])[0])
        except BaseException:
            for pool_rank in pool_ranks:  # best effort: do not leave half-built roles behind
                self.submit(pool_rank, "drop_role", name)
            raise
        handle = Handle(
            pool=self, role=name, pool_ranks=pool_ranks, rank_infos=infos, specs=specs[0]
        )
        self.roles[name] = handle
        self.role_targets[name] = role_target(spec, kwargs)
        return handle

    def init_process_group(
        self, pool_ranks: tuple[int, ...], *, group_name: str, timeout_s: float | None = None
    ) -> None:
        """World group over the pool (once), then a subgroup over ``pool_ranks`` if smaller.

        Backend: gloo on CPU, ``cpu:gloo,cuda:nccl`` on CUDA. ``timeout_s`` (default
        ``collective_timeout_s``) bounds the rendezvous and every later collective.
        """
        self.process_groups.append((group_name, tuple(pool_ranks)))
        timeout = timeout_s or self.config.collective_timeout_s
        backend = "gloo" if self.config.device == "cpu" else "cpu:gloo,cuda:nccl"
        everyone = tuple(range(self.num_devices))
        if not self._world_ready:
            self._control(
                "init_process_group",
                everyone,
                WORLD_GROUP,
                list(everyone),
                backend,
                timeout,
                timeout_s=timeout + 30.0,
            )
            self._world_ready = True
        if tuple(sorted(pool_ranks)) != everyone:
            self._control(
                "init_process_group",
                tuple(pool_ranks),
                group_name,
                list(pool_ranks),
                backend,
                timeout,
                timeout_s=timeout + 30.0,
            )

    def shutdown(self) -> None:
        """Kill the workers and remove the placement groups (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        for actor in self._actors:
            with contextlib.suppress(Exception):  # already dead: nothing left to kill
                ray.kill(actor, no_restart=True)
        for pg in self._placement_groups:
            with contextlib.suppress(Exception):  # already removed
                remove_placement_group(pg)
        self._actors.clear()
        self._placement_groups.clear()
