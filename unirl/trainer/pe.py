"""The prompt-enhancer trainer: a placement recipe of the loop in ``unirl.trainer.base``.

Two stages on one response (``unirl.rollout.engine.composed.ComposedEngine``):

- ``pe`` (the parent track): a causal-LM policy rewrites each user prompt ``n`` times
  (``sampling.samples_per_prompt``); it always trains (the recipe's top-level blocks: bundle,
  pipeline, backend, algorithm, stack, sampling, as in a ``train_vlm`` recipe);
- ``diffusion`` (the child track): a flow-matching model draws ``k`` images of each rewrite
  (``pe.diffusion.sampling.samples_per_prompt``); frozen by default, trained with its own
  backend, algorithm and stack when ``pe.train_both``.

The reward scores the child's images (against the *user's* prompt); a rewrite's reward is the
``pe.reduce`` (mean | max) of its kept images' (``propagate_rewards``); advantages are per
track: the rewrites of one user prompt form a parent group, the ``k`` images of one rewrite a
child group. With ``pe.share_noise`` (default) image ``j`` of every rewrite of one prompt
starts from the same x_T, so a parent group compares rewrites, not noise draws.

Who samples the rewrites (``rollout``): the policy itself (``ComposedEngine``, trainside: every
role a sibling on every worker, no weight copy), or SGLang's text server
(``SGLangLLMEngine``, a dedicated engine holding its own copy of the policy; the composed
engine is then built by this trainer from ``pe.compose`` and samples through it). A served
policy runs on ``pe_served.PEServedLayout``: ``colocate`` (the server sleeps while the trainer
steps) or ``separate`` (the policy trains on its own slab; the server, the frozen drawer, the
composed engine and the reward on the other), and after each update the policy's weights go
to the server per the recipe's ``sync`` block (``FullSync``: bf16 tensors; ``LoraSync``: the
adapter, loaded by name) — the ``pe`` stage's sync. The drawer's track syncs on its own when
it trains on a dedicated engine (``pe.diffusion.rollout``: ``DedicatedEngine``, with
``pe.diffusion.sync``: the ``diffusion`` stage's sync, its own cadence and transport);
otherwise it needs none: it samples with the module it trains (``pe.train_both``, colocate)
or stays frozen.

The ``pe`` block's types and every check before Ray are in ``pe_config``; the roles both
layouts place (``DrawerInfo``) in ``pe_roles``, the stages' roles from ``roles.stage_roles``; the served layout in
``pe_served``.

Metrics: the image stage is the main one (``reward/mean`` is the image reward; ``train/*``
when it trains), the policy's go under ``pe/`` (``pe/train/loss``, ``pe/reward/mean`` of the
propagated rewards, ``pe/response_length/*``, ``pe/empty_rewrites``, ``pe/capped_rewrites``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from unirl.config.run import RunConfig
from unirl.config.validate import declared, locate
from unirl.distributed.group import placement, remote
from unirl.distributed.group.pool import PoolBase
from unirl.sde.sde_steps import AllSteps
from unirl.trainer.ar import ARTrainOps, response_metrics
from unirl.trainer.base import ComposedTrainer, write_sample_rows
from unirl.trainer.pe_config import IMAGE_TRACK, TEXT_TRACK, PEConfig, check_pe_engine
from unirl.trainer.pe_roles import DrawerInfo
from unirl.trainer.request import (
    EVAL_ID_OFFSET,
    text_request,
)
from unirl.trainer.roles import RewardWorker, TrainOps, init_world, stage_roles
from unirl.trainer.stage import Stage, kept_reward_stats
from unirl.types import (
    STATUS_OK,
    DiffusionSamplingParams,
    RolloutReq,
    RolloutTrack,
)

# -- the trainer ----------------------------------------------------------------------------------


def rewrite_metrics(track: RolloutTrack) -> dict[str, float]:
    """``empty_rewrites`` / ``capped_rewrites`` (counts) and ``rewrite_chars/mean`` from the
    composed engine's per-rewrite metadata."""
    meta = [m for m in track.metadata if "rewrite" in m]
    if not meta:
        return {}
    return {
        "empty_rewrites": float(sum(bool(m["rewrite_empty"]) for m in meta)),
        "capped_rewrites": float(sum(bool(m["rewrite_capped"]) for m in meta)),
        "rewrite_chars/mean": sum(len(m["rewrite"]) for m in meta) / len(meta),
    }


class PETrainer(ComposedTrainer):
    """A prompt-enhancer recipe as a placement of the loop: the ``pe`` policy stage and its
    ``diffusion`` child; every role a sibling on every worker (trainside), or the policy
    served by a dedicated text engine that its stage syncs (``pe_served.PEServedLayout``)."""

    composed: PEConfig
    child_sampling: DiffusionSamplingParams

    def after_init(self) -> None:
        pe = self.composed
        self.sde_steps = self.child_sampling.sde_steps or AllSteps()
        self.trains_sde_steps = False
        if pe.train_both:
            algorithm = locate(str(pe.diffusion.algorithm["_target_"]), "pe.diffusion.algorithm")  # type: ignore[index]
            self.trains_sde_steps = bool(
                declared(algorithm, "requires_log_prob", "pe.diffusion.algorithm", "StageAlgorithm")
            )

    # -- placement -----------------------------------------------------------------------------

    def place_roles(self, pool: PoolBase) -> None:
        cfg, pe = self.cfg, self.composed
        sync = draw_sync = None
        if check_pe_engine({"rollout": cfg.rollout}) == "served":
            from unirl.trainer.pe_served import PEServedLayout  # it builds on this module's roles

            layout = PEServedLayout(cfg, pool, pe, self.data)
            roles = layout.roles
            text = {"stack": roles.stack, "algorithm": roles.algorithm, "ops": roles.ops}
            draw, self.info, reward = layout.draw, layout.info, layout.roles.reward
            self.rollout = layout.rollout
            sync, draw_sync = layout.policy_sync, layout.drawer_sync
            print(f"[unirl] served: {layout.describe()}", flush=True)
        else:
            init_world(pool, cfg)
            with placement(pool, fraction=1.0):  # every role a sibling on every worker
                text = stage_roles(
                    cfg, prefix=TEXT_TRACK, algorithm_takes="policy", ops_class=ARTrainOps
                )
                draw = stage_roles(
                    pe.diffusion, prefix=IMAGE_TRACK, algorithm_takes="pipeline", ops_class=TrainOps
                )
                self.info = remote(
                    DrawerInfo, name=f"{IMAGE_TRACK}_info", pipeline=draw["pipeline"]
                )
                self.rollout = remote(
                    cfg.rollout,
                    name="rollout",
                    text_sampler=text["pipeline"],
                    image_sampler=draw["pipeline"],
                    keep_image_trajectory=pe.train_both,
                )
                reward = remote(RewardWorker, name="reward", service=cfg.reward)
        self.stages = self.make_stages(text, draw, reward, sync, draw_sync)
        self.policy_ops = text["ops"]

    def after_place(self) -> None:
        pe = self.composed
        policy = self.policy_ops.describe_policy()
        drawer = self.info.describe(self.child_sampling)
        self.latent_shape = drawer["latent_shape"]
        self.schedules = {mode: sigmas.cpu() for mode, sigmas in drawer["sigmas"].items()}
        print(
            f"[unirl] policy: {policy['trainable_params']:,} trainable parameters on "
            f"{policy['device']}; drawer: {drawer['params']:,} parameters on {drawer['device']} "
            f"({'trained' if pe.train_both else 'frozen'})",
            flush=True,
        )

    def make_stages(
        self,
        text: dict[str, Any],
        draw: dict[str, Any],
        reward: Any,
        sync: Any = None,
        draw_sync: Any = None,
    ) -> list[Stage]:
        """The two stages from their roles: ``pe`` (trains, metrics under ``pe/``; ``sync``:
        a served policy's weight sync, its ``sync/*`` metrics under ``pe/``) and its child
        ``diffusion`` (scored; its rewards reach ``pe`` by ``pe.reduce``; trains only with
        ``pe.train_both``; ``draw_sync``: a dedicated drawer's own weight sync, else it
        samples with the module it trains)."""
        cfg, pe = self.cfg, self.composed
        train_ranks, rollout_ranks = cfg.slab_sizes()
        lora = lambda block: (block or {}).get("lora") is not None  # noqa: E731
        return [
            Stage(
                track=TEXT_TRACK,
                stack=text["stack"],
                algorithm=text["algorithm"],
                ops=text["ops"],
                sync=sync,
                train_ranks=train_ranks,
                rollout_ranks=rollout_ranks,
                prefix=TEXT_TRACK,
                exports_lora=lora(cfg.backend),
                exports_model=not lora(cfg.backend),
            ),
            Stage(
                track=IMAGE_TRACK,
                parent=TEXT_TRACK,
                reward=reward,
                reward_from_children=pe.reduce,
                stack=draw.get("stack"),
                algorithm=draw.get("algorithm"),
                ops=draw.get("ops"),
                sync=draw_sync,
                train_ranks=train_ranks,
                rollout_ranks=rollout_ranks,
                exports_lora=pe.train_both and lora(pe.diffusion.backend),
            ),
        ]

    # -- request building ------------------------------------------------------------------

    def build_request(
        self, prompts: list[Any], rollout_index: int, *, mode: str = "train"
    ) -> RolloutReq:
        """Ids and groups of the rewrites; the policy's ``TextRequest`` (seed ids = sample
        ids) and the drawer's fanned-out :class:`DiffusionRequest` (image ids, x_T ids, SDE steps, σ)."""
        train = mode == "train"
        spp = self.samples_per_prompt(mode)
        k = self.child_sampling.samples_per_prompt
        b = len(prompts)
        n = b * spp
        offset = 0 if train else EVAL_ID_OFFSET
        image_ids = torch.arange(
            offset + rollout_index * n * k, offset + (rollout_index + 1) * n * k
        ).view(n, k)
        noise_ids = image_ids
        if self.composed.share_noise:  # every rewrite of a prompt: the first rewrite's k x_T ids
            noise_ids = image_ids.view(b, spp, k)[:, :1].expand(b, spp, k).reshape(n, k)
        sampling = self.sampling

        def stages(sample_ids: torch.Tensor) -> dict[str, Any]:
            return {
                TEXT_TRACK: text_request(sampling, sample_ids, mode),
                IMAGE_TRACK: self.latent_request(  # k images per rewrite: a fan-out
                    self.child_sampling,
                    noise_ids,
                    rollout_index,
                    mode,
                    sample_ids=image_ids,
                    trains_sde=self.trains_sde_steps,
                    own_params=True,
                ),
            }

        return self.request_for(prompts, rollout_index, mode, stages)

    def track_metrics(self, stage: Stage, track: RolloutTrack) -> dict[str, float]:
        """The policy's propagated rewards, response lengths and rewrite counters."""
        if stage.track != TEXT_TRACK:
            return {}
        extra = {**response_metrics(track), **rewrite_metrics(track)}
        assert track.status is not None
        extra.update(kept_reward_stats(track))
        extra["dropped_rewrites"] = float((track.status != STATUS_OK).sum())
        return extra

    def gallery(self, path: Path, track: RolloutTrack, limit: int) -> Path:
        """The images captioned with the rewrite they were drawn from (PNG), and
        ``<path>.jsonl``: user prompt, rewrite, reward per image."""
        rewrites = [str(m.get("rewrite", "")) for m in track.metadata]
        sheet = super().gallery(path, dataclasses.replace(track, prompts=rewrites), limit)
        parents = track.parent_ids.tolist() if track.parent_ids is not None else [None] * len(track)
        columns = {"parent_id": parents, "prompt": track.prompts or [""] * len(track)}
        write_sample_rows(path, track, limit, {**columns, "rewrite": rewrites})
        return sheet


def run_pe(cfg: RunConfig, data: dict[str, Any], pe: PEConfig) -> int:
    return PETrainer(cfg, data, pe).run()
