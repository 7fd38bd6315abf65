"""The prompt enhancer's recipe before any Ray work: the ``pe`` block's types
(``PEConfig``, ``DrawerConfig``), which engine places the policy (``check_pe_engine``), every
check of the policy's, the drawer's and the composed engine's blocks (``check_pe_recipe``,
the drawer validated as its own recipe), and what ``dry_run`` prints beside the plan
(``drawer_summary``). ``unirl.trainer.pe`` runs what these accept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from unirl.config.require import ConfigError, require
from unirl.config.run import RunConfig
from unirl.config.validate import check_block, locate, validate
from unirl.models.common.pipeline import FlowMatchingPipeline
from unirl.models.common_ar.pipeline import CausalLMPipeline
from unirl.rollout.engine.composed import ComposedEngine
from unirl.trainer.stage import ComposedStageConfig
from unirl.types import ARSamplingParams, DiffusionSamplingParams

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
class PEConfig(ComposedStageConfig):
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

    block_key: ClassVar[str] = "pe"
    entry: ClassVar[str] = "unirl.train_pe"
    owner: ClassVar[str] = "the drawer's"
    example: ClassVar[str] = "examples/pe/pe_tiny_trainside.yaml"


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
