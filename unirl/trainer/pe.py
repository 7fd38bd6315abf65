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

Metrics: the image stage is the main one (``reward/mean`` is the image reward; ``train/*``
when it trains), the policy's go under ``pe/`` (``pe/train/loss``, ``pe/reward/mean`` of the
propagated rewards, ``pe/response_length/*``, ``pe/empty_rewrites``, ``pe/capped_rewrites``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from hydra.utils import instantiate

from unirl.config.require import ConfigError, require
from unirl.config.run import RunConfig
from unirl.config.typecheck import check_config_mapping
from unirl.config.validate import check_block, declared, locate, validate
from unirl.distributed.group import DevicePool, Handle, placement, remote
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.models.common.pipeline import FlowMatchingPipeline
from unirl.models.common_ar.pipeline import CausalLMPipeline
from unirl.rollout.engine.composed import ComposedEngine, DrawRequest
from unirl.sde.sde_steps import AllSteps
from unirl.trainer.ar import ARTrainOps, response_metrics
from unirl.trainer.base import StageTrainer
from unirl.trainer.roles import RewardWorker, TrainOps
from unirl.trainer.stage import Stage
from unirl.types import (
    STATUS_OK,
    ARSamplingParams,
    DiffusionSamplingParams,
    RolloutReq,
    RolloutTrack,
    TextRequest,
    Texts,
)

TEXT_TRACK = ComposedEngine.text_track
IMAGE_TRACK = ComposedEngine.image_track
TRAIN_BLOCKS = ("backend", "algorithm", "stack")
SET_BY_TRAINER = ("text_sampler", "image_sampler", "keep_image_trajectory")
COMPOSED = f"{ComposedEngine.__module__}.{ComposedEngine.__name__}"
SERVED_KINDS = ("sglang",)  # dedicated text engines the composed engine can sample through


@dataclass(kw_only=True)
class DrawerConfig:
    """``pe.diffusion``: the drawer's component blocks (``_target_`` mappings). ``bundle``,
    ``pipeline`` and ``sampling`` (a ``DiffusionSamplingParams``; ``samples_per_prompt`` is
    ``k``, the images per rewrite) always; ``backend``, ``algorithm`` and ``stack`` only with
    ``pe.train_both``. ``rollout`` and ``sync``: a trained drawer sampled by a dedicated
    engine (``DedicatedEngine``, its own copy of the drawer) that the drawer's stage syncs —
    its own track's sync, beside the served policy's; without them the drawer samples with
    the module it trains (or, frozen, with its only copy)."""

    bundle: dict[str, Any]
    pipeline: dict[str, Any]
    sampling: dict[str, Any]
    backend: dict[str, Any] | None = None
    algorithm: dict[str, Any] | None = None
    stack: dict[str, Any] | None = None
    rollout: dict[str, Any] | None = None
    sync: dict[str, Any] | None = None

    @property
    def dedicated(self) -> bool:
        """The drawer samples on a dedicated engine of its own (``pe.diffusion.rollout``)."""
        return self.rollout is not None


@dataclass(kw_only=True)
class PEConfig:
    """The recipe's ``pe`` block: how the two stages are tied.

    ``reduce``: a rewrite's reward from its kept images (``mean`` | ``max``). ``train_both``:
    the drawer trains too (its own backend, algorithm and stack under ``pe.diffusion``).
    ``share_noise``: image ``j`` of every rewrite of one user prompt starts from the same x_T
    (common random numbers: a parent group's advantages compare rewrites, not noise draws).
    ``compose``: the composed engine's knobs (``max_rewrite_chars``, ``empty_rewrite``,
    ``resident``) when ``rollout`` names a served policy (SGLang's text engine); with the
    trainside ``ComposedEngine`` they sit in the ``rollout`` block itself.
    """

    diffusion: DrawerConfig
    reduce: Literal["mean", "max"] = "mean"
    train_both: bool = False
    share_noise: bool = True
    compose: dict[str, Any] | None = None

    @classmethod
    def of(cls, block: Any) -> PEConfig:
        """The typed ``pe`` block; one line naming the key when it is wrong."""
        require(
            isinstance(block, dict),
            "unirl.train_pe needs a `pe` block (pe.diffusion: the drawer's bundle, pipeline "
            "and sampling; pe.reduce, pe.train_both); see examples/pe/pe_tiny_trainside.yaml",
        )
        checked = check_config_mapping(block, cls, "pe")
        require(
            isinstance(checked.get("diffusion"), dict),
            "pe.diffusion is missing: give the drawer's bundle, pipeline and sampling blocks",
        )
        drawer = check_config_mapping(checked["diffusion"], DrawerConfig, "pe.diffusion")
        for name in ("bundle", "pipeline", "sampling"):
            value = drawer.get(name)
            require(
                isinstance(value, dict) and "_target_" in value,
                f"pe.diffusion.{name} is missing: give the drawer's {name} block with its _target_",
            )
        checked["diffusion"] = DrawerConfig(**drawer)
        return cls(**checked)


# -- checks before any Ray work ----------------------------------------------------------------


def check_pe_engine(data: dict[str, Any]) -> str:
    """The engine this trainer can place, read from the raw recipe before anything else:
    ``trainside`` (``rollout`` is the ``ComposedEngine``: the policy samples its own rewrites)
    or ``served`` (``rollout`` is SGLang's text engine; the composed engine samples through
    it and the recipe's ``sync`` block feeds it the policy's weights)."""
    rollout = data.get("rollout") or {}
    target = str(rollout.get("_target_", "")) if isinstance(rollout, dict) else ""
    require(
        bool(target),
        f"rollout._target_ is missing; use {COMPOSED} (trainside) or "
        "unirl.rollout.engine.sglang_llm.SGLangLLMEngine (the policy served by SGLang)",
    )
    engine = locate(target, "rollout")
    if isinstance(engine, type) and issubclass(engine, ComposedEngine):
        return "trainside"
    if getattr(engine, "engine_kind", None) in SERVED_KINDS:
        return "served"
    raise ConfigError(
        f"rollout._target_={target}: unirl.train_pe samples the rewrites with the policy "
        f"itself ({COMPOSED}) or on SGLang's text server "
        "(unirl.rollout.engine.sglang_llm.SGLangLLMEngine with a FullSync or LoraSync block); "
        "the drawer is given in pe.diffusion, not in rollout"
    )


def compose_block(data: dict[str, Any], pe: PEConfig, *, separate: bool) -> dict[str, Any]:
    """The composed engine's block of a served policy: ``pe.compose`` over ``ComposedEngine``.
    On a separate rollout slab the tracks travel whole (``resident: false``: the policy's
    trainer is no sibling of the engine that would park them)."""
    knobs = dict(pe.compose or {})
    set_here = sorted(k for k in (*SET_BY_TRAINER, "_target_") if k in knobs)
    require(
        not set_here,
        f"pe.compose: {set_here} are set by unirl.train_pe; remove them (pe.compose holds "
        "max_rewrite_chars, empty_rewrite, resident)",
    )
    require(
        not (separate and knobs.get("resident")),
        "pe.compose.resident=true needs the policy's trainer beside the composed engine; with "
        "layout=separate the tracks travel to the train slab: remove pe.compose.resident",
    )
    if separate:
        knobs["resident"] = False
    block = {"_target_": COMPOSED, **knobs}
    check_block(block, "pe.compose", instantiate_dataclasses=False)
    return block


def _subclass(block: dict[str, Any], where: str, base: type, fix: str) -> None:
    target = str(block.get("_target_", ""))
    cls = locate(target, where)
    require(
        isinstance(cls, type) and issubclass(cls, base),
        f"{where}._target_={target} is not a {base.__name__}; {fix}",
    )


def drawer_recipe(data: dict[str, Any], pe: PEConfig, rewrites_per_rollout: int) -> dict[str, Any]:
    """The recipe seen from the drawer: the top-level blocks replaced by ``pe.diffusion``'s and
    ``batch_size`` = rewrites per rollout (each rewrite is one of its prompts). Its engine is
    its own: ``pe.diffusion.rollout`` / ``sync`` (a dedicated drawer), else the composed
    engine it samples in, unsynced (never the served policy's engine and sync)."""
    d = pe.diffusion
    view = {**data, "batch_size": rewrites_per_rollout, "pe": None}
    view.update({name: getattr(d, name) for name in ("bundle", "pipeline", "sampling")})
    view.update({name: getattr(d, name) for name in TRAIN_BLOCKS})
    if d.dedicated:
        view.update(rollout=d.rollout, sync=d.sync)
    elif check_pe_engine(data) == "served":
        view.update(rollout={"_target_": COMPOSED, **(pe.compose or {})}, sync=None)
    return view


def check_pe_recipe(
    cfg: RunConfig, data: dict[str, Any], objs: dict[str, Any]
) -> tuple[PEConfig, RunConfig, dict[str, Any]]:
    """Before any Ray work, after ``validate`` checked the policy's (top-level) blocks: the
    ``pe`` block, the engine, the policy's and the drawer's families, and the drawer's blocks
    (all of ``validate``'s checks on the drawer's view when it trains). Returns the typed
    ``pe`` block and the drawer's ``(RunConfig, objs)``."""
    mode = check_pe_engine(data)
    pe = PEConfig.of(cfg.pe)
    if mode == "trainside":
        require(
            pe.compose is None,
            "pe.compose is for a served policy (rollout: SGLangLLMEngine); with the trainside "
            "ComposedEngine set max_rewrite_chars / empty_rewrite in the rollout block",
        )
    else:
        compose_block(data, pe, separate=cfg.layout == "separate")
        require(
            not (pe.train_both and cfg.layout == "separate" and not pe.diffusion.dedicated),
            "pe.train_both=true with layout=separate: the trained drawer samples with the "
            "module it trains (a sibling of its trainer), so it cannot sit on the rollout slab "
            "beside the served policy; give it a dedicated engine (pe.diffusion.rollout: "
            "DedicatedEngine, pe.diffusion.sync), use layout=colocate, or pe.train_both=false",
        )
    target = str((cfg.sampling or {}).get("_target_", ""))
    require(
        isinstance(objs.get("sampling"), ARSamplingParams),
        f"sampling._target_={target or None}: the policy samples text; use "
        "unirl.types.ARSamplingParams (the drawer's sampling goes in pe.diffusion.sampling)",
    )
    _subclass(
        cfg.pipeline,
        "pipeline",
        CausalLMPipeline,
        "the policy is a causal-LM pipeline (unirl.models.qwen3.Qwen3Pipeline)",
    )
    set_here = sorted(k for k in SET_BY_TRAINER if k in (cfg.rollout or {}))
    require(
        not set_here,
        f"rollout: {set_here} are set by unirl.train_pe (the policy's and the drawer's "
        "pipelines, pe.train_both); remove them from the recipe",
    )
    d = pe.diffusion
    _subclass(
        d.pipeline,
        "pe.diffusion.pipeline",
        FlowMatchingPipeline,
        "the drawer is a flow-matching pipeline (unirl.models.sd3.SD3Pipeline)",
    )
    given = [name for name in TRAIN_BLOCKS if getattr(d, name) is not None]
    missing = [name for name in TRAIN_BLOCKS if getattr(d, name) is None]
    if pe.train_both and missing:
        raise ConfigError(
            f"pe.train_both=true trains the drawer: give pe.diffusion.{missing[0]} (its "
            "backend, algorithm and stack, as in a train_diffusion recipe)"
        )
    if not pe.train_both and given:
        raise ConfigError(
            f"pe.diffusion.{given[0]} is set but pe.train_both=false (the drawer is frozen): "
            f"set pe.train_both=true to train it, or remove pe.diffusion.{'/'.join(given)}"
        )
    if d.dedicated or d.sync is not None:
        _check_dedicated_drawer(pe, mode)
    view = drawer_recipe(data, pe, cfg.batch_size * objs["sampling"].samples_per_prompt)
    try:
        if pe.train_both:
            d_cfg, d_objs = validate(view)
        else:
            d_cfg, d_objs = _check_frozen_drawer(view)
    except ConfigError as exc:
        raise ConfigError(f"pe.diffusion: {exc}") from exc
    require(
        isinstance(d_objs.get("sampling"), DiffusionSamplingParams),
        f"pe.diffusion.sampling._target_={d.sampling.get('_target_')}: the drawer samples "
        "images; use unirl.types.DiffusionSamplingParams",
    )
    return pe, d_cfg, d_objs


def _check_dedicated_drawer(pe: PEConfig, mode: str) -> None:
    """A dedicated drawer: a trained one (``pe.train_both``), with both blocks, on a
    ``dedicated`` engine, beside a served policy (the layout that syncs per track)."""
    d = pe.diffusion
    require(
        d.rollout is not None and d.sync is not None,
        "pe.diffusion: a dedicated drawer needs both pe.diffusion.rollout (its engine, "
        "unirl.rollout.engine.dedicated.DedicatedEngine) and pe.diffusion.sync (FullSync or "
        "LoraSync); give both or neither",
    )
    require(
        pe.train_both,
        "pe.diffusion.rollout: a dedicated drawer exists to be synced after each update of a "
        "trained drawer; set pe.train_both=true (with its backend, algorithm, stack) or remove "
        "pe.diffusion.rollout / pe.diffusion.sync",
    )
    assert d.rollout is not None
    target = str(d.rollout.get("_target_", ""))
    kind = getattr(locate(target, "pe.diffusion.rollout"), "engine_kind", None)
    require(
        kind == "dedicated",
        f"pe.diffusion.rollout._target_={target} is a {kind!r} engine; a dedicated drawer is "
        "unirl.rollout.engine.dedicated.DedicatedEngine",
    )
    require(
        mode == "served",
        "pe.diffusion.rollout: a dedicated drawer is placed beside a served policy (rollout: "
        "SGLangLLMEngine, whose layout syncs each track); with the trainside ComposedEngine "
        "remove pe.diffusion.rollout / pe.diffusion.sync (the drawer samples with the module it "
        "trains)",
    )


def _check_frozen_drawer(view: dict[str, Any]) -> tuple[RunConfig, dict[str, Any]]:
    """A frozen drawer's blocks: keys and types of bundle, pipeline (and its strategy) and
    sampling, and the bundle's and pipeline's own ``check_config`` hooks (model path, image
    sizes), reading configs only."""
    d_cfg = RunConfig.from_dict(view)
    objs: dict[str, Any] = {}
    for name in ("bundle", "pipeline", "sampling"):
        block = getattr(d_cfg, name)
        objs[name] = check_block(
            block, name, instantiate_dataclasses=(name == "sampling"), typed_component=True
        )
        hook = getattr(locate(str(block["_target_"]), name), "check_config", None)
        if callable(hook):
            hook(block, d_cfg)
    device = d_cfg.bundle.get("device")
    require(
        device is None or str(device).split(":")[0] == d_cfg.device,
        f"bundle.device={device!r} disagrees with device={d_cfg.device!r}; set one device",
    )
    return d_cfg, objs


def plan_roles(cfg: RunConfig, pe: PEConfig) -> list[tuple[str, str, str]]:
    """``(role, _target_, slab)`` in creation order — printed by ``dry_run``."""
    target = lambda block: str((block or {}).get("_target_", "?"))  # noqa: E731
    served = check_pe_engine({"rollout": cfg.rollout}) == "served"
    train_slab = rollout_slab = "all workers (colocate)"
    if served and cfg.layout == "separate":
        n_train, _ = cfg.slab_sizes()
        train_slab = f"train slab: pool ranks 0-{n_train - 1}"
        rollout_slab = f"rollout slab: pool ranks {n_train}-{cfg.num_devices - 1}"
    roles = [
        (f"{TEXT_TRACK}_{name}", target(getattr(cfg, name)), train_slab)
        for name in ("bundle", "pipeline", "backend", "algorithm", "stack")
    ]
    if served:
        roles.append((f"{TEXT_TRACK}_sync", target(cfg.sync), f"{train_slab} -> rollout"))
        roles.append((f"{TEXT_TRACK}_engine", target(cfg.rollout), rollout_slab))
    d = pe.diffusion
    names = ("bundle", "pipeline", *(TRAIN_BLOCKS if pe.train_both else ()))
    draw_slab = train_slab if d.dedicated else rollout_slab  # where the drawer's module lives
    roles += [(f"{IMAGE_TRACK}_{n}", target(getattr(d, n)), draw_slab) for n in names]
    if d.dedicated:
        roles.append((f"{IMAGE_TRACK}_sync", target(d.sync), f"{train_slab} -> rollout"))
        roles.append((f"{IMAGE_TRACK}_engine", target(d.rollout), rollout_slab))
    composed = COMPOSED if served else target(cfg.rollout)
    roles += [("rollout", composed, rollout_slab), ("reward", target(cfg.reward), rollout_slab)]
    return roles


def drawer_summary(pe: PEConfig, d_cfg: RunConfig, d_objs: dict[str, Any]) -> dict[str, Any]:
    """What ``dry_run`` prints about the drawer beside the policy's geometry."""
    from unirl.config.dry_run import batch_geometry

    sampling: DiffusionSamplingParams = d_objs["sampling"]
    out: dict[str, Any] = {
        "reduce": pe.reduce,
        "train_both": pe.train_both,
        "share_noise": pe.share_noise,
        "rewrites_per_rollout": d_cfg.batch_size,
        "images_per_rewrite": sampling.samples_per_prompt,
        "images_per_rollout": d_cfg.batch_size * sampling.samples_per_prompt,
        "resolution": f"{sampling.height}x{sampling.width}",
        "num_inference_steps": sampling.num_inference_steps,
        "cfg": sampling.guidance_scale > 1.0,
        "sampled_by": "its dedicated engine (synced)" if pe.diffusion.dedicated else "itself",
    }
    if pe.train_both:
        geometry = batch_geometry(d_cfg, d_objs)
        for key in ("samples_per_train_rank", "optimizer_steps_per_rollout", "micro_batch_size"):
            out[f"drawer_{key}"] = geometry[key]
        out["trained_steps_first_rollout"] = geometry["trained_steps_first_rollout"]
    return out


# -- roles ----------------------------------------------------------------------------------------


def stage_roles(
    blocks: Any, prefix: str, *, algorithm_takes: str, ops_class: type
) -> dict[str, Handle]:
    """One stage's roles in the current placement block, named ``<prefix>_<role>``: bundle and
    pipeline, then (when ``blocks.backend`` is set) backend, algorithm (given the pipeline as
    ``algorithm_takes``), stack and ops."""
    bundle = remote(blocks.bundle, name=f"{prefix}_bundle")
    pipeline = remote(blocks.pipeline, name=f"{prefix}_pipeline", bundle=bundle)
    roles = {"bundle": bundle, "pipeline": pipeline}
    if blocks.backend is None:
        return roles
    backend = remote(blocks.backend, name=f"{prefix}_backend", bundle=bundle)
    needs: dict[str, Any] = {algorithm_takes: pipeline}  # the policy / the pipeline it replays
    algorithm = remote(blocks.algorithm, name=f"{prefix}_algorithm", **needs)
    stack = remote(blocks.stack, name=f"{prefix}_stack", backend=backend, algorithm=algorithm)
    ops = remote(
        ops_class,
        name=f"{prefix}_ops",
        backend=backend,
        pipeline=pipeline,
        stack=stack,
        algorithm=algorithm,
    )
    return {**roles, "backend": backend, "algorithm": algorithm, "stack": stack, "ops": ops}


class DrawerInfo:
    """What the driver needs from the drawer's family to author requests (a frozen drawer has
    no ``TrainOps``): the latent of one image and the σ schedules of the train and eval step
    counts at the sampling size."""

    def __init__(self, *, pipeline: Any) -> None:
        self.pipeline = pipeline

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def describe(self, sampling: DiffusionSamplingParams) -> dict[str, Any]:
        bundle = self.pipeline.bundle
        height, width = int(sampling.height), int(sampling.width)
        return {
            "latent_shape": tuple(bundle.latent_shape_for(sampling)),
            "sigmas": {
                "train": bundle.sigmas(int(sampling.num_inference_steps), height, width),
                "eval": bundle.sigmas(int(sampling.eval_num_inference_steps), height, width),
            },
            "params": sum(
                p.numel() for m in bundle.trainable_modules.values() for p in m.parameters()
            ),
            "device": str(bundle.device),
        }


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


class PETrainer(StageTrainer):
    """A prompt-enhancer recipe as a placement of the loop: the ``pe`` policy stage and its
    ``diffusion`` child; every role a sibling on every worker (trainside), or the policy
    served by a dedicated text engine that its stage syncs (``pe_served.PEServedLayout``)."""

    def __init__(self, cfg: RunConfig, data: dict[str, Any], pe: PEConfig) -> None:
        super().__init__(cfg, data)
        self.pe = pe
        self.sampling: ARSamplingParams = instantiate(cfg.sampling, _convert_="object")
        self.draw_sampling: DiffusionSamplingParams = instantiate(
            pe.diffusion.sampling, _convert_="object"
        )
        self.sde_steps = self.draw_sampling.sde_steps or AllSteps()
        self.trains_sde_steps = False
        if pe.train_both:
            algorithm = locate(str(pe.diffusion.algorithm["_target_"]), "pe.diffusion.algorithm")  # type: ignore[index]
            self.trains_sde_steps = bool(
                declared(algorithm, "requires_log_prob", "pe.diffusion.algorithm", "StageAlgorithm")
            )

    # -- placement -----------------------------------------------------------------------------

    def place(self, pool: DevicePool) -> None:
        cfg, pe = self.cfg, self.pe
        sync = draw_sync = None
        if check_pe_engine({"rollout": cfg.rollout}) == "served":
            from unirl.trainer.pe_served import PEServedLayout  # it builds on this module's roles

            layout = PEServedLayout(cfg, pool, pe, self.data)
            roles = layout.roles
            text = {"stack": roles.stack, "algorithm": roles.algorithm, "ops": roles.ops}
            draw, info, reward = layout.draw, layout.info, layout.roles.reward
            self.rollout = layout.rollout
            sync, draw_sync = layout.policy_sync, layout.drawer_sync
            print(f"[unirl] served: {layout.describe()}", flush=True)
        else:
            if cfg.num_devices > 1:
                pool.init_process_group(tuple(range(cfg.num_devices)), group_name="world")
            with placement(pool, fraction=1.0):  # every role a sibling on every worker
                text = stage_roles(cfg, TEXT_TRACK, algorithm_takes="policy", ops_class=ARTrainOps)
                draw = stage_roles(
                    pe.diffusion, IMAGE_TRACK, algorithm_takes="pipeline", ops_class=TrainOps
                )
                info = remote(DrawerInfo, name=f"{IMAGE_TRACK}_info", pipeline=draw["pipeline"])
                self.rollout = remote(
                    cfg.rollout,
                    name="rollout",
                    text_sampler=text["pipeline"],
                    image_sampler=draw["pipeline"],
                    keep_image_trajectory=pe.train_both,
                )
                reward = remote(RewardWorker, name="reward", service=cfg.reward)
        self.stages = self.make_stages(text, draw, reward, sync, draw_sync)
        policy = text["ops"].describe_policy()
        drawer = info.describe(self.draw_sampling)
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
        cfg, pe = self.cfg, self.pe
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
        ids) and the drawer's :class:`DrawRequest` (image ids, x_T ids, SDE steps, σ)."""
        train = mode == "train"
        spp = self.sampling.samples_per_prompt if train else self.cfg.eval.samples_per_prompt
        k = self.draw_sampling.samples_per_prompt
        b = len(prompts)
        n = b * spp
        offset = 0 if train else 10**12
        sample_ids = torch.arange(offset + rollout_index * n, offset + (rollout_index + 1) * n)
        group_base = rollout_index * b
        group_ids = torch.arange(group_base, group_base + b).repeat_interleave(spp)
        image_ids = torch.arange(
            offset + rollout_index * n * k, offset + (rollout_index + 1) * n * k
        ).view(n, k)
        noise_ids = image_ids
        if self.pe.share_noise:  # every rewrite of a prompt: the first rewrite's k x_T ids
            noise_ids = image_ids.view(b, spp, k)[:, :1].expand(b, spp, k).reshape(n, k)
        sigmas = self.schedules["train" if train else "eval"].clone()
        steps = (
            self.draw_sampling.num_inference_steps
            if train
            else self.draw_sampling.eval_num_inference_steps
        )
        if train and self.trains_sde_steps:
            chosen = self.sde_steps.select(steps, seed=self.cfg.seed, rollout_index=rollout_index)
            sde_indices = torch.tensor([list(chosen)] * n, dtype=torch.long)
        else:
            sde_indices = torch.zeros((n, 0), dtype=torch.long)
        sampling = self.sampling
        return RolloutReq(
            sample_ids=sample_ids,
            group_ids=group_ids,
            primitives={"text": Texts(texts=[ex.prompt for ex in prompts for _ in range(spp)])},
            metadata=[dict(ex.metadata) for ex in prompts for _ in range(spp)],
            stage_params={
                TEXT_TRACK: TextRequest(
                    seed_ids=sample_ids.clone(),
                    max_new_tokens=sampling.max_new_tokens,
                    temperature=sampling.temperature_for(mode),
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    stop=tuple(sampling.stop or ()),
                ),
                IMAGE_TRACK: DrawRequest(
                    sample_ids=image_ids.clone(),
                    init_noise_ids=noise_ids.clone(),
                    sde_indices=sde_indices,
                    sigmas=sigmas,
                    init_noise_shape=tuple(self.latent_shape),
                    sampling_params=self.draw_sampling,
                ),
            },
            sampling_params=sampling,
            seed=self.cfg.seed if train else self.cfg.eval.seed,
            rollout_index=rollout_index,
            mode=mode,  # type: ignore[arg-type]
        )

    # -- what the two tracks add -----------------------------------------------------------------

    def train_stage(
        self, stage: Stage, track: RolloutTrack, rollout_index: int
    ) -> dict[str, float]:
        """The base's training step; the policy's adds its propagated rewards, response
        lengths and rewrite counters."""
        out = super().train_stage(stage, track, rollout_index)
        if stage.track == TEXT_TRACK:
            extra = {**response_metrics(track), **rewrite_metrics(track)}
            assert track.rewards is not None and track.status is not None
            kept = track.rewards.float()[track.kept]
            extra["reward/mean"] = float(kept.mean()) if kept.numel() else math.nan
            extra["reward/std"] = float(kept.std(unbiased=False)) if kept.numel() > 1 else 0.0
            extra["dropped_rewrites"] = float((track.status != STATUS_OK).sum())
            out.update({stage.key(k): v for k, v in extra.items()})
        return out

    def gallery(self, path: Path, track: RolloutTrack, limit: int) -> Path:
        """The images captioned with the rewrite they were drawn from (PNG), and
        ``<path>.jsonl``: user prompt, rewrite, reward per image."""
        rewrites = [str(m.get("rewrite", "")) for m in track.metadata]
        sheet = super().gallery(path, dataclasses.replace(track, prompts=rewrites), limit)
        rewards = track.rewards.tolist() if track.rewards is not None else [math.nan] * len(track)
        parents = track.parent_ids.tolist() if track.parent_ids is not None else [None] * len(track)
        with path.with_suffix(".jsonl").open("w", encoding="utf-8") as f:
            for i in range(min(limit, len(track))):
                row = {
                    "sample_id": int(track.sample_ids[i]),
                    "parent_id": parents[i],
                    "prompt": (track.prompts or [""] * len(track))[i],
                    "rewrite": rewrites[i],
                    "reward": rewards[i],
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return sheet


def run_pe(cfg: RunConfig, data: dict[str, Any], pe: PEConfig) -> int:
    return PETrainer(cfg, data, pe).run()
