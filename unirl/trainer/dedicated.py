"""Dedicated rollout engines: the two layouts, sleep / wake, and the weight-sync cadence.

``colocate``: one placement block over every worker; the engine (its own inference copy) is a
sibling of the trainer on each worker, woken for sampling and put to sleep for training;
weights move in-process (``transport=local``) or through CUDA IPC to an engine server process.

``separate``: two top-level placement blocks — the train slab (``train_fraction`` of the
devices: bundle, backend, algorithm, stack, ops, sync source) and the rollout slab (the
rest: engine, reward). The train slab gets its own ``torch.distributed`` world (FSDP must not
span the rollout workers); weights cross slabs through Ray's object store or a dedicated
sync group (trainer rank 0 + every rollout rank).

Cadence: the first rollout of a run (fresh or resumed) is preceded by a forced sync; after
training rollout ``k`` a sync is due when ``(k + 1) % interval == 0`` and runs right before
the next rollout (after wake-up in colocate). An eval rollout first pushes whatever the trainer
holds at that moment (EMA weights while the trainer swaps them in) and marks the engine
dirty, so the next train rollout re-syncs the trained weights.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from unirl.config.run import RunConfig
from unirl.distributed.group import Handle, placement, remote
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.group.pool import PoolBase
from unirl.distributed.weight_sync import SyncSource, WeightSync, WeightSyncDriver, build_sync
from unirl.distributed.weight_sync.group import free_port, node_address
from unirl.trainer.roles import RewardWorker, init_world, stage_roles
from unirl.types import RolloutReq, RolloutResp


class SlabWorld:
    """Initialises the default ``torch.distributed`` group over one slab only (the train slab
    of the separate layout), so FSDP shards across train workers and never the rollout ones."""

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def endpoint(self) -> tuple[str, int]:
        return node_address(), free_port()

    @distributed(dispatch=Dispatch.BROADCAST)
    def init(self, host: str, port: int, backend: str, timeout_s: float) -> int:
        import torch.distributed as dist

        from unirl.distributed.group.role import current_rank_info

        info = current_rank_info()
        if not dist.is_initialized():
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{host}:{port}",
                rank=info.rank,
                world_size=info.world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        return int(dist.get_world_size())


def train_slab_world(pool: PoolBase, cfg: RunConfig, timeout_s: float) -> None:
    """In the separate layout's train block: the train slab's own ``torch.distributed`` world
    (FSDP shards over the train workers only), a :class:`SlabWorld` role; its rendezvous is
    skipped on a plan-only pool. One train worker needs none."""
    n_train, _ = cfg.slab_sizes()
    if n_train < 2:
        return
    world = remote(SlabWorld, name="train_world")
    if not pool.plans_only:
        host, port = world.endpoint()
        backend = "gloo" if cfg.device == "cpu" else "cpu:gloo,cuda:nccl"
        world.init(host, port, backend, float(timeout_s))


@dataclass(kw_only=True)
class DedicatedRoles:
    """Handles of a dedicated-engine run; ``rollout`` is the ``SyncedRollout`` stand-in."""

    bundle: Handle
    pipeline: Handle
    backend: Handle
    engine: Handle
    reward: Handle
    algorithm: Handle
    stack: Handle
    ops: Handle
    source: Handle


class SyncedRollout:
    """What the trainer loop calls ``rollout``: ``generate`` wakes the engine (colocate),
    runs a pending sync, samples, and puts the engine back to sleep (colocate)."""

    def __init__(self, *, engine: Handle, driver: WeightSyncDriver, colocate: bool) -> None:
        self.engine = engine
        self.driver = driver
        self.colocate = colocate
        self.pending: str | None = "first"  # the first rollout of a run (fresh or resumed) syncs
        self.dirty = False  # the engine holds eval (EMA) weights
        self._metrics: list[dict[str, float]] = []

    def generate(self, req: RolloutReq) -> RolloutResp:
        if self.colocate:
            self.engine.wake_up()
        try:
            if req.mode == "eval":
                self._sync("eval")
                self.dirty = True
            elif self.pending is not None or self.dirty:
                self._sync(self.pending or "after_eval")
            return self.engine.generate(req)
        finally:
            if self.colocate:
                self.engine.sleep()

    def _sync(self, reason: str) -> None:
        self._metrics.append(self.driver.run(reason=reason))
        self.pending = None
        self.dirty = False

    def after_train(self, rollout_index: int) -> dict[str, float]:
        """Mark the next sync due per the interval; returns the ``sync/*`` metrics of the
        syncs since the last call (times and bytes summed)."""
        if self.driver.due(rollout_index):
            self.pending = "interval"
        return self.pop_metrics()

    def pop_metrics(self) -> dict[str, float]:
        if not self._metrics:
            return {}
        out = dict(self._metrics[-1])
        for key in ("sync/time_s", "sync/bytes"):
            out[key] = sum(m[key] for m in self._metrics)
        out["sync/forced"] = max(m["sync/forced"] for m in self._metrics)
        out["sync/syncs_since_last_log"] = float(len(self._metrics))
        self._metrics = []
        return out

    def close(self) -> None:
        self.driver.close()


class DedicatedLayout:
    """Builds the roles of a dedicated-engine run on ``pool`` and its sync driver."""

    def __init__(self, cfg: RunConfig, pool: PoolBase) -> None:
        self.cfg = cfg
        self.sync: WeightSync = build_sync(cfg.sync)
        self.colocate = cfg.layout == "colocate"
        self.sync.transport_for(cfg.layout)  # fail before any role exists
        self.roles = self._build_colocate(pool) if self.colocate else self._build_separate(pool)
        interval = self.sync.interval if self.sync.interval is not None else cfg.sync_interval
        self.driver = WeightSyncDriver(
            sync=self.sync,
            source=self.roles.source,
            engine=self.roles.engine,
            layout=cfg.layout,
            interval=interval,
            group_backend="gloo" if cfg.device == "cpu" else "nccl",
        )
        self.rollout = SyncedRollout(
            engine=self.roles.engine, driver=self.driver, colocate=self.colocate
        )

    def _train_roles(self) -> dict[str, Handle]:
        return stage_roles(self.cfg)

    def _build_colocate(self, pool: PoolBase) -> DedicatedRoles:
        cfg = self.cfg
        init_world(pool, cfg)
        with placement(pool, fraction=1.0):
            train = self._train_roles()
            engine = remote(cfg.rollout, name="rollout")
            reward = remote(RewardWorker, name="reward", service=cfg.reward)
            source = remote(
                SyncSource,
                name="sync_source",
                backend=train["backend"],
                sync=cfg.sync,
                engine=engine,
            )
        if (
            not pool.plans_only
        ):  # asleep until the first rollout wakes it (checkpoint loading may come first)
            engine.sleep()
        return DedicatedRoles(engine=engine, reward=reward, source=source, **train)

    def _build_separate(self, pool: PoolBase) -> DedicatedRoles:
        cfg = self.cfg
        n_train, n_rollout = cfg.slab_sizes()
        with placement(pool, devices=n_train, shared_workers=False):
            train_slab_world(pool, cfg, self.sync.timeout_s)
            train = self._train_roles()
            source = remote(SyncSource, name="sync_source", backend=train["backend"], sync=cfg.sync)
        with placement(pool, devices=n_rollout, shared_workers=False):
            engine = remote(cfg.rollout, name="rollout")
            reward = remote(RewardWorker, name="reward", service=cfg.reward)
        return DedicatedRoles(engine=engine, reward=reward, source=source, **train)

    def describe(self) -> str:
        return (
            f"dedicated engine, layout={self.cfg.layout}, {self.sync!r}, transport={self.driver.transport}, "
            f"interval={self.driver.interval}"
        )

    def after_train(self, rollout_index: int) -> dict[str, float]:
        return self.rollout.after_train(rollout_index)

    def close(self) -> None:
        self.rollout.close()


def build_dedicated_layout(cfg: RunConfig, pool: PoolBase) -> DedicatedLayout:
    """The roles and sync driver of a run whose rollout engine is not trainside."""
    return DedicatedLayout(cfg, pool)
