"""A prompt enhancer whose policy is served by a dedicated text engine (SGLang): the layout
that places it and the weight sync of the policy's track (see ``unirl.trainer.pe``).

The pieces are ``trainer/dedicated.py``'s: ``DedicatedLayout`` (colocate / separate, the
sync driver and its cadence), ``SyncedRollout`` (wake, sync when due, sample, sleep),
``SyncSource`` on the policy's backend. What is PE's own: the roles in each placement block
(the drawer and the composed engine beside the text engine) and that a rollout samples
through the composed engine while sleep, wake and sync reach the text engine.
"""

from __future__ import annotations

from typing import Any

from unirl.config.run import RunConfig
from unirl.distributed.group import DevicePool, Handle, placement, remote
from unirl.distributed.weight_sync import SyncSource
from unirl.trainer.ar import ARTrainOps
from unirl.trainer.dedicated import DedicatedLayout, DedicatedRoles, SlabWorld, SyncedRollout
from unirl.trainer.pe import (
    IMAGE_TRACK,
    TEXT_TRACK,
    DrawerInfo,
    PEConfig,
    compose_block,
    stage_roles,
)
from unirl.trainer.roles import RewardWorker, TrainOps
from unirl.types import RolloutReq, RolloutTrack


class ServedPolicy:
    """The policy's text engine as :class:`~unirl.trainer.dedicated.SyncedRollout` drives
    it: ``wake_up`` / ``sleep`` reach the text engine (its server frees memory while the
    trainer steps), ``generate`` and ``fetch_decoded`` the composed engine, which samples
    through the text engine as its sibling."""

    def __init__(self, *, engine: Handle, composed: Handle) -> None:
        self.engine = engine
        self.composed = composed

    def wake_up(self) -> None:
        self.engine.wake_up()

    def sleep(self) -> None:
        self.engine.sleep()

    def generate(self, req: RolloutReq) -> Any:
        return self.composed.generate(req)

    def fetch_decoded(self, track: RolloutTrack) -> RolloutTrack:
        return self.composed.fetch_decoded(track)


class ServedRollout(SyncedRollout):
    """What the loop calls ``rollout`` for a served policy: ``SyncedRollout``'s cadence (a
    forced sync before the first rollout, then per interval; eval weights pushed and undone)
    on the policy's track, sampling through the composed engine; parked media are read back
    from it."""

    def fetch_decoded(self, track: RolloutTrack) -> RolloutTrack:
        return self.engine.fetch_decoded(track)


class PEServedLayout(DedicatedLayout):
    """The prompt enhancer with its policy served by a dedicated text engine
    (``rollout``: ``SGLangLLMEngine``), on ``DedicatedLayout``'s two layouts and its sync
    driver (``SyncSource`` on the policy's backend -> the text engine, per ``sync``).

    ``colocate``: one block over every worker: the policy's training roles, the text engine
    (asleep until a rollout wakes it), the drawer (frozen, or trained with ``pe.train_both``),
    the composed engine (``text_sampler`` = the text engine, ``image_sampler`` = the drawer's
    pipeline), the reward and the sync source. ``separate``: the policy trains on its own slab
    (its own ``torch.distributed`` world); the text engine, the frozen drawer, the composed
    engine and the reward share the rollout slab. ``roles`` are the policy's
    (``DedicatedRoles``); ``draw`` the drawer's, ``composed`` and ``info`` the composed
    engine and the drawer's family facts.
    """

    def __init__(self, cfg: RunConfig, pool: DevicePool, pe: PEConfig, data: dict[str, Any]):
        self.pe = pe
        self.compose = compose_block(data, pe, separate=cfg.layout == "separate")
        super().__init__(cfg, pool)
        self.rollout = ServedRollout(
            # ServedPolicy has the three Handle methods SyncedRollout calls (duck-typed)
            engine=ServedPolicy(engine=self.roles.engine, composed=self.composed),  # type: ignore[arg-type]
            driver=self.driver,
            colocate=self.colocate,
        )

    def _drawer_and_composed(self, engine: Handle) -> Handle:
        """In the current placement block: the drawer's roles, its info, the composed engine
        over ``engine`` and the drawer, and the reward (returned)."""
        self.draw = stage_roles(
            self.pe.diffusion, IMAGE_TRACK, algorithm_takes="pipeline", ops_class=TrainOps
        )
        self.info = remote(DrawerInfo, name=f"{IMAGE_TRACK}_info", pipeline=self.draw["pipeline"])
        self.composed = remote(
            self.compose,
            name="rollout",
            text_sampler=engine,
            image_sampler=self.draw["pipeline"],
            keep_image_trajectory=self.pe.train_both,
        )
        return remote(RewardWorker, name="reward", service=self.cfg.reward)

    def _policy_roles(self) -> dict[str, Handle]:
        return stage_roles(self.cfg, TEXT_TRACK, algorithm_takes="policy", ops_class=ARTrainOps)

    def _build_colocate(self, pool: DevicePool) -> DedicatedRoles:
        cfg = self.cfg
        if cfg.num_devices > 1:
            pool.init_process_group(tuple(range(cfg.num_devices)), group_name="world")
        with placement(pool, fraction=1.0):
            text = self._policy_roles()
            engine = remote(cfg.rollout, name=f"{TEXT_TRACK}_engine")
            reward = self._drawer_and_composed(engine)
            source = remote(
                SyncSource,
                name=f"{TEXT_TRACK}_sync_source",
                backend=text["backend"],
                sync=cfg.sync,
                engine=engine,
            )
        engine.sleep()  # asleep until the first rollout wakes it
        return DedicatedRoles(engine=engine, reward=reward, source=source, **text)

    def _build_separate(self, pool: DevicePool) -> DedicatedRoles:
        cfg = self.cfg
        n_train, n_rollout = cfg.slab_sizes()
        with placement(pool, devices=n_train, shared_workers=False):
            if n_train > 1:  # FSDP shards over the train slab only
                world = remote(SlabWorld, name="train_world")
                host, port = world.endpoint()
                backend = "gloo" if cfg.device == "cpu" else "cpu:gloo,cuda:nccl"
                world.init(host, port, backend, float(self.sync.timeout_s))
            text = self._policy_roles()
            source = remote(
                SyncSource, name=f"{TEXT_TRACK}_sync_source", backend=text["backend"], sync=cfg.sync
            )
        with placement(pool, devices=n_rollout, shared_workers=False):
            engine = remote(cfg.rollout, name=f"{TEXT_TRACK}_engine")
            reward = self._drawer_and_composed(engine)
        return DedicatedRoles(engine=engine, reward=reward, source=source, **text)
