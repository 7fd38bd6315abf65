"""A prompt enhancer whose policy is served by a dedicated text engine (SGLang): the layout
that places it and the weight sync per track (see ``unirl.trainer.pe``).

The pieces are ``trainer/dedicated.py``'s: ``DedicatedLayout`` (colocate / separate, the
sync driver and its cadence), ``SyncedRollout`` (wake, sync when due, sample, sleep),
``SyncSource`` on a stage's backend, ``WeightSyncDriver``. What is PE's own: the roles in each
placement block (the drawer and the composed engine beside the text engine) and that a
rollout samples through the composed engine while sleep, wake and sync reach each track's
engine. Each synced track has its own ``SyncedRollout`` (its stage's ``sync``); they nest:

    drawer's SyncedRollout (a dedicated drawer only) -> policy's SyncedRollout -> composed engine

so a rollout wakes and syncs the drawer's engine, then the policy's, samples both tracks in
one composed call, and puts them back to sleep in reverse order.
"""

from __future__ import annotations

from typing import Any

from unirl.config.run import RunConfig
from unirl.distributed.group import Handle, placement, remote
from unirl.distributed.group.pool import PoolBase
from unirl.distributed.weight_sync import SyncSource, WeightSyncDriver, build_sync
from unirl.trainer.ar import ARTrainOps
from unirl.trainer.dedicated import (
    DedicatedLayout,
    DedicatedRoles,
    SyncedRollout,
    train_slab_world,
)
from unirl.trainer.pe_config import IMAGE_TRACK, TEXT_TRACK, PEConfig, compose_block
from unirl.trainer.pe_roles import DrawerInfo
from unirl.trainer.roles import RewardWorker, TrainOps, init_world, stage_roles
from unirl.types import RolloutReq, RolloutTrack


class TrackEngine:
    """One track's dedicated engine as :class:`~unirl.trainer.dedicated.SyncedRollout`
    drives it: ``wake_up`` / ``sleep`` reach the engine (a server frees its memory while the
    trainer steps), ``generate`` and ``fetch_decoded`` the ``sampler`` that answers the whole
    response (the composed engine, or the next track's ``SyncedRollout``)."""

    def __init__(self, *, engine: Handle, sampler: Any) -> None:
        self.engine = engine
        self.sampler = sampler

    def wake_up(self) -> None:
        self.engine.wake_up()

    def sleep(self) -> None:
        self.engine.sleep()

    def generate(self, req: RolloutReq) -> Any:
        return self.sampler.generate(req)

    def fetch_decoded(self, track: RolloutTrack) -> RolloutTrack:
        return self.sampler.fetch_decoded(track)


class TrackSync(SyncedRollout):
    """A track's ``SyncedRollout`` over a :class:`TrackEngine`: its cadence (a forced sync
    before the first rollout of a run, then per interval; eval weights pushed and undone), the
    stage's ``sync`` (``after_train`` -> ``sync/*`` metrics); parked media are read back from
    the composed engine."""

    def __init__(self, *, engine: Handle, sampler: Any, driver: WeightSyncDriver, colocate: bool):
        track = TrackEngine(engine=engine, sampler=sampler)
        # TrackEngine has the Handle methods SyncedRollout calls (duck-typed)
        super().__init__(engine=track, driver=driver, colocate=colocate)  # type: ignore[arg-type]

    def fetch_decoded(self, track: RolloutTrack) -> RolloutTrack:
        return self.engine.fetch_decoded(track)


class PEServedLayout(DedicatedLayout):
    """The prompt enhancer with its policy served by a dedicated text engine
    (``rollout``: ``SGLangLLMEngine``), on ``DedicatedLayout``'s two layouts and its sync
    driver (``SyncSource`` on the policy's backend -> the text engine, per ``sync``); a
    dedicated drawer (``pe.diffusion.rollout``, trained) gets a driver of its own
    (``SyncSource`` on the drawer's backend -> its ``DedicatedEngine``, per
    ``pe.diffusion.sync``).

    ``colocate``: one block over every worker: the policy's training roles, the text engine
    (asleep until a rollout wakes it), the drawer (frozen, trained, or trained with its own
    engine), the composed engine (``text_sampler`` = the text engine, ``image_sampler`` = the
    drawer's pipeline or engine), the reward and the sync sources. ``separate``: the training
    roles (the policy's, a dedicated drawer's) and their sync sources on the train slab (its
    own ``torch.distributed`` world); the text engine, the frozen drawer or the drawer's
    engine, the composed engine and the reward on the rollout slab.

    ``roles``: the policy's (``DedicatedRoles``); ``draw``: the drawer's roles; ``composed``,
    ``info``: the composed engine and the drawer's family facts; ``policy_sync`` /
    ``drawer_sync`` (``None`` unless dedicated): each track's :class:`TrackSync`;
    ``rollout``: the outermost of them (what the loop calls).
    """

    def __init__(self, cfg: RunConfig, pool: PoolBase, pe: PEConfig, data: dict[str, Any]):
        self.pe = pe
        self.compose = compose_block(data, pe, separate=cfg.layout == "separate")
        d = pe.diffusion
        self.drawer_weight_sync = build_sync(d.sync) if d.dedicated else None
        if self.drawer_weight_sync is not None:
            self.drawer_weight_sync.transport_for(cfg.layout)  # fail before any role exists
        self.draw_engine: Handle | None = None
        self.draw_source: Handle | None = None
        super().__init__(cfg, pool)
        self.policy_sync = TrackSync(
            engine=self.roles.engine,
            sampler=self.composed,
            driver=self.driver,
            colocate=self.colocate,
        )
        self.drawer_sync: TrackSync | None = None
        if self.drawer_weight_sync is not None:
            sync = self.drawer_weight_sync
            assert self.draw_engine is not None and self.draw_source is not None
            self.drawer_sync = TrackSync(
                engine=self.draw_engine,
                sampler=self.policy_sync,
                driver=WeightSyncDriver(
                    sync=sync,
                    source=self.draw_source,
                    engine=self.draw_engine,
                    layout=cfg.layout,
                    interval=sync.interval if sync.interval is not None else cfg.sync_interval,
                    group_backend="gloo" if cfg.device == "cpu" else "nccl",
                ),
                colocate=self.colocate,
            )
        self.rollout = self.drawer_sync or self.policy_sync

    # -- roles ---------------------------------------------------------------------------------

    def _policy_roles(self) -> dict[str, Handle]:
        return stage_roles(
            self.cfg, prefix=TEXT_TRACK, algorithm_takes="policy", ops_class=ARTrainOps
        )

    def _drawer_roles(self) -> None:
        """The drawer's roles and facts in the current block; a dedicated drawer's sync source
        too (sending to its engine in-process when the engine is already a sibling here)."""
        d = self.pe.diffusion
        self.draw = stage_roles(
            d, prefix=IMAGE_TRACK, algorithm_takes="pipeline", ops_class=TrainOps
        )
        self.info = remote(DrawerInfo, name=f"{IMAGE_TRACK}_info", pipeline=self.draw["pipeline"])
        if d.dedicated:
            siblings: dict[str, Any] = {"engine": self.draw_engine} if self.colocate else {}
            self.draw_source = remote(
                SyncSource,
                name=f"{IMAGE_TRACK}_sync_source",
                backend=self.draw["backend"],
                sync=d.sync,
                **siblings,
            )

    def _sampling_roles(self, engine: Handle) -> Handle:
        """In the current block: the composed engine over the text ``engine`` and the drawer
        (its pipeline, or its dedicated engine), and the reward (returned)."""
        image_sampler = self.draw_engine if self.draw_engine is not None else self.draw["pipeline"]
        self.composed = remote(
            self.compose,
            name="rollout",
            text_sampler=engine,
            image_sampler=image_sampler,
            keep_image_trajectory=self.pe.train_both,
        )
        return remote(RewardWorker, name="reward", service=self.cfg.reward)

    def _drawer_engine(self) -> None:
        if self.pe.diffusion.rollout is not None:
            self.draw_engine = remote(self.pe.diffusion.rollout, name=f"{IMAGE_TRACK}_engine")

    def _build_colocate(self, pool: PoolBase) -> DedicatedRoles:
        cfg = self.cfg
        init_world(pool, cfg)
        with placement(pool, fraction=1.0):
            text = self._policy_roles()
            engine = remote(cfg.rollout, name=f"{TEXT_TRACK}_engine")
            self._drawer_engine()
            self._drawer_roles()
            reward = self._sampling_roles(engine)
            source = remote(
                SyncSource,
                name=f"{TEXT_TRACK}_sync_source",
                backend=text["backend"],
                sync=cfg.sync,
                engine=engine,
            )
        for asleep in (engine, self.draw_engine):  # until the first rollout wakes them
            if asleep is not None and not pool.plans_only:
                asleep.sleep()
        return DedicatedRoles(engine=engine, reward=reward, source=source, **text)

    def _build_separate(self, pool: PoolBase) -> DedicatedRoles:
        cfg = self.cfg
        n_train, n_rollout = cfg.slab_sizes()
        dedicated_drawer = self.pe.diffusion.dedicated
        with placement(pool, devices=n_train, shared_workers=False):
            train_slab_world(pool, cfg, self.sync.timeout_s)
            text = self._policy_roles()
            source = remote(
                SyncSource, name=f"{TEXT_TRACK}_sync_source", backend=text["backend"], sync=cfg.sync
            )
            if dedicated_drawer:  # it trains here and samples on the rollout slab
                self._drawer_roles()
        with placement(pool, devices=n_rollout, shared_workers=False):
            engine = remote(cfg.rollout, name=f"{TEXT_TRACK}_engine")
            if dedicated_drawer:
                self._drawer_engine()
            else:  # frozen: its only copy samples here
                self._drawer_roles()
            reward = self._sampling_roles(engine)
        return DedicatedRoles(engine=engine, reward=reward, source=source, **text)

    def describe(self) -> str:
        out = f"policy: {super().describe()}"
        if self.drawer_sync is not None:
            driver = self.drawer_sync.driver
            out += (
                f"; drawer: dedicated engine, {driver.sync!r}, transport={driver.transport}, "
                f"interval={driver.interval}"
            )
        return out
