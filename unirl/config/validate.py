"""Cross-component validators: run by the driver on the composed recipe before any Ray work.

Each check raises ``ConfigError`` with a message that names the fields involved and the fix.
Component blocks are checked by ``_target_`` signature (a misspelt key is an error); the
typed config of a component that declares one (``TrainStack`` -> ``TrainStackConfig``, a
bundle -> its ``config_class``; ``unirl.config.component``) and nested config dataclasses
(SDE strategy, SDE-step schedule, LoRA, optimizer, sampling) are built, which runs their own
``__post_init__`` validation, and the checks read those objects. No weights are loaded.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from unirl.config.component import component_config, config_class_of, config_field_names
from unirl.config.geometry import BatchGeometry
from unirl.config.precision import canonical_precision
from unirl.config.require import ConfigError, require
from unirl.config.run import COMPONENT_BLOCKS, RunConfig
from unirl.config.typecheck import annotations_of, check_fields, config_class

REQUIRED_BLOCKS = tuple(b for b in COMPONENT_BLOCKS if b != "sync")  # sync: dedicated engines only
ENGINE_KINDS = ("trainside", "dedicated", "sglang", "vllm_omni")  # a rollout class's engine_kind
PRECISION_KEYS = (
    "dtype",
    "param_dtype",
    "reduce_dtype",
    "storage_dtype",
    "text_encoder_dtype",
    "vae_dtype",
    "wire_dtype",
)


def locate(path: str, where: str) -> Any:
    """Import ``module.attr`` named by a ``_target_``; the error names the block."""
    module_name, _, attr = path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name) if module_name else None
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError) as exc:
        # ``a.b.C.method`` style targets: walk from the longest importable module prefix
        parts = path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for part in parts[cut:]:
                    obj = getattr(obj, part)
                return obj
            except AttributeError:
                break
        raise ConfigError(f"{where}._target_: cannot import {path!r} ({exc})") from exc


def _signature_params(target: Callable[..., object]) -> tuple[set[str], bool]:
    """Accepted keyword names of a target and whether it takes ``**kwargs``. A component
    with a ``config_class`` takes the config's fields (its ``**knobs``) and nothing else."""
    if dataclasses.is_dataclass(target):
        return {f.name for f in dataclasses.fields(target) if f.init}, False
    func = target.__init__ if inspect.isclass(target) else target
    sig = inspect.signature(func)
    names = {
        n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    names.discard("self")
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    knobs = config_class_of(target)
    if knobs is not None:
        return names | config_field_names(knobs), False
    return names, var_kw


def check_block(
    block: object, where: str, *, instantiate_dataclasses: bool, typed_component: bool = False
) -> Any:
    """Check a ``_target_`` block recursively; returns the instantiated object for cheap
    dataclass targets (when allowed), the typed config of a component that declares a
    ``config_class`` (when ``typed_component``: a top-level block), or the block itself."""
    if isinstance(block, list):
        return [
            check_block(b, f"{where}[{i}]", instantiate_dataclasses=instantiate_dataclasses)
            for i, b in enumerate(block)
        ]
    if not isinstance(block, dict):
        return block
    for key in PRECISION_KEYS:
        if key in block and isinstance(block[key], str):
            canonical_precision(block[key], f"{where}.{key}")
    children = {
        k: check_block(v, f"{where}.{k}", instantiate_dataclasses=True)
        for k, v in block.items()
        if k != "_target_"
    }
    if "_target_" not in block:
        return children
    target = locate(str(block["_target_"]), where)
    accepted, var_kw = _signature_params(target)
    unknown = sorted(k for k in children if not k.startswith("_") and k not in accepted)
    if unknown and not var_kw:
        import difflib

        close = {
            u: difflib.get_close_matches(u, sorted(accepted), n=1, cutoff=0.6) for u in unknown
        }
        hints = [f"{u!r} -> {c[0]!r}" for u, c in close.items() if c]
        hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
        raise ConfigError(
            f"{where}: unknown key(s) {unknown} for {block['_target_']}{hint}; accepted keys are "
            f"{sorted(accepted)}"
        )
    plain = {k: v for k, v in block.items() if not k.startswith("_")}
    for key, value in check_fields(plain, target, where).items():
        if type(value) is not type(plain[key]):  # an int given where a float is expected
            children[key] = value
    kwargs = {k: v for k, v in children.items() if not k.startswith("_")}
    if instantiate_dataclasses and dataclasses.is_dataclass(target):
        try:
            # is_dataclass narrows the located class to DataclassInstance | type[...]
            return target(**kwargs)  # type: ignore[operator]
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    if typed_component and config_class_of(target) is not None:
        return component_config(target, kwargs, where)
    return block


def _nested_configs(block: Mapping[str, object], name: str) -> dict[str, object]:
    """The cheap objects of a component's sub-blocks, keyed ``"<block>.<key>"``: each
    ``_target_`` sub-block built (dataclasses only), and a plain mapping given where the
    component's signature names a config dataclass (``algorithm.kl`` -> ``KLConfig``) built as
    that dataclass, so validators read typed configs instead of strings."""
    hints = annotations_of(locate(str(block["_target_"]), name)) if "_target_" in block else {}
    out: dict[str, object] = {}
    for key, value in block.items():
        where = f"{name}.{key}"
        if isinstance(value, dict) and "_target_" in value:
            out[where] = check_block(value, where, instantiate_dataclasses=True)
            continue
        if not isinstance(value, dict):
            continue
        cls = config_class(hints.get(key))
        if cls is None:
            continue
        try:
            out[where] = cls(**{k: v for k, v in value.items() if not k.startswith("_")})
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    return out


def declared(target: object, knob: str, where: str, base: str) -> object:
    """The class knob ``knob`` that ``target`` declares (``StageAlgorithm.requires_log_prob``,
    ``SDEStrategy.provides_log_prob``, ...): read from the class or instance, never given a
    default here, so the base class stays the one place its default is written."""
    require(
        hasattr(target, knob),
        f"{where}: {getattr(target, '__name__', type(target).__name__)} declares no {knob}; "
        f"subclass {base}, which declares it with its default",
    )
    return getattr(target, knob)


def _algorithm_knob(cfg: RunConfig, knob: str) -> object:
    """A class knob of the recipe's algorithm (``None`` when the block names no class)."""
    target = _target(cfg, "algorithm")
    if not target:
        return None
    return declared(
        locate(target, "algorithm"), knob, "algorithm", "unirl.algorithms.StageAlgorithm"
    )


def _target(cfg: RunConfig, name: str) -> str:
    block = getattr(cfg, name)
    return str(block.get("_target_", "")) if isinstance(block, dict) else ""


def engine_kind(cfg: RunConfig) -> str:
    """The kind the rollout engine class declares (its class attribute ``engine_kind``):
    ``trainside`` | ``dedicated`` | ``sglang`` | ``vllm_omni``. It decides the sync and layout
    rules, so a class that declares none (or another value) is refused."""
    target = _target(cfg, "rollout")
    require(
        bool(target),
        "rollout._target_ is missing; name a rollout engine class (e.g. unirl.rollout.TrainsideEngine)",
    )
    kind = getattr(locate(target, "rollout"), "engine_kind", None)
    require(
        kind in ENGINE_KINDS,
        f"rollout._target_={target} declares engine_kind={kind!r}; a rollout engine class sets "
        f"the class attribute engine_kind to one of {', '.join(ENGINE_KINDS)}",
    )
    return str(kind)


# -- the cross-component checks --------------------------------------------------------------


def check_required_blocks(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    missing = [b for b in REQUIRED_BLOCKS if getattr(cfg, b) is None]
    require(
        not missing, f"recipe is missing block(s) {missing}; every recipe builds these by _target_"
    )


def check_layout_and_sync(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    kind = engine_kind(cfg)
    if kind == "trainside":
        require(
            cfg.sync is None,
            "rollout is trainside (it samples with the trained module), so remove the `sync` block",
        )
        require(
            cfg.layout == "colocate",
            "layout=separate needs a dedicated rollout engine; trainside runs colocated only",
        )
    else:
        require(
            cfg.sync is not None,
            f"rollout engine {kind!r} holds its own weights: add exactly one `sync` block",
        )
        sync_target = _target(cfg, "sync").lower()
        if "ipc" in sync_target:
            require(
                cfg.layout == "colocate", "CUDA-IPC weight sync works only with layout=colocate"
            )
    if cfg.layout == "separate":
        require(
            cfg.num_devices >= 2,
            "layout=separate needs num_devices >= 2 (disjoint train and rollout slabs)",
        )
        require(
            cfg.train_fraction < 1.0,
            "layout=separate needs train_fraction < 1 so rollout gets devices",
        )


def check_sequence_parallel(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``parallel.sequence_parallel_size`` > 1: a diffusion recipe with a trainside engine
    whose device count the SP size divides (the family's shard plan and head count are
    ``unirl.train_diffusion``'s checks, ``trainer.diffusion.check_sequence_parallel_model``)."""
    sp = cfg.parallel.sequence_parallel_size
    if sp == 1:
        return
    require(
        cfg.entrypoint in (None, "unirl.train_diffusion"),
        f"parallel.sequence_parallel_size={sp}: sequence parallelism is built for the video "
        f"diffusion families (unirl.train_diffusion), not {cfg.entrypoint}; set it to 1",
    )
    kind = engine_kind(cfg)
    require(
        kind == "trainside",
        f"parallel.sequence_parallel_size={sp} needs the trainside engine "
        f"(rollout._target_=unirl.rollout.TrainsideEngine); a {kind!r} engine samples with its "
        "own copy of the model, which is not split; set parallel.sequence_parallel_size=1",
    )
    require(
        cfg.num_devices % sp == 0,
        f"parallel.sequence_parallel_size={sp} does not divide num_devices={cfg.num_devices} "
        f"(the train ranks); use a num_devices that is a multiple of {sp}",
    )


def check_updates_per_rollout(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """Several optimizer steps per rollout only for algorithms that declare
    ``supports_multi_update`` (DiffusionNFT does not), and not with π_old taken from the loss
    forward (``old_logp_source=current``): refused here, not on the workers."""
    updates = BatchGeometry.of(cfg, objs).num_updates_per_batch
    if updates == 1:
        return
    supports = _algorithm_knob(cfg, "supports_multi_update")
    require(
        supports is None or bool(supports),
        f"{_target(cfg, 'algorithm')} does not support several updates per rollout; set "
        f"stack.num_updates_per_batch=1 (got {updates})",
    )
    block = cfg.algorithm if isinstance(cfg.algorithm, dict) else {}
    require(
        block.get("old_logp_source") != "current",
        "algorithm.old_logp_source=current takes π_old from the loss forward, which is only "
        f"the sampling policy's in the first optimizer step (stack.num_updates_per_batch="
        f"{updates}): set stack.num_updates_per_batch=1 or algorithm.old_logp_source=replay",
    )


def check_fp8_sampling(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``bundle.fp8_sampling`` samples in FP8 while π_old is replayed in the training
    precision: refused with ``old_logp_source=rollout`` (the FP8 sampler's log-probs as
    π_old), with ``pipeline.record_uncond`` (the FP8 sampler's v_u in the loss), and with an
    external engine (it samples with its own model, which the knob does not reach)."""
    if not bool((cfg.bundle or {}).get("fp8_sampling", False)):
        return
    block = cfg.algorithm if isinstance(cfg.algorithm, dict) else {}
    require(
        block.get("old_logp_source") != "rollout",
        "bundle.fp8_sampling=true samples in FP8, so the rollout's log-probs are not the "
        "training precision's π_old: set algorithm.old_logp_source=replay (or current), or "
        "bundle.fp8_sampling=false",
    )
    require(
        not bool((cfg.pipeline or {}).get("record_uncond", False)),
        "bundle.fp8_sampling=true: pipeline.record_uncond=true would reuse the FP8 sampler's "
        "unconditional velocity in the loss; set pipeline.record_uncond=false or "
        "bundle.fp8_sampling=false",
    )
    kind = engine_kind(cfg)
    require(
        kind in ("trainside", "dedicated"),
        f"bundle.fp8_sampling=true quantizes the bundle's own sampler; a {kind!r} engine samples "
        "with its own model; set bundle.fp8_sampling=false",
    )


def check_batch_geometry(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    geometry = BatchGeometry.of(cfg, objs)
    n = geometry.samples_per_rollout
    train_dp, rollout_dp = geometry.train_ranks, geometry.rollout_ranks
    require(
        train_dp >= 1 and rollout_dp >= 1,
        f"train_fraction={cfg.train_fraction} leaves a slab with no devices",
    )
    sp = cfg.parallel.sequence_parallel_size
    # with sequence parallelism a data-parallel rank is an SP group of ranks
    over = (
        f" (num_devices / parallel.sequence_parallel_size={sp}); change batch_size, num_devices "
        "or parallel.sequence_parallel_size"
        if sp > 1
        else "; change batch_size or num_devices"
    )
    require(
        n % rollout_dp == 0,
        f"batch_size x samples_per_prompt = {n} samples is not divisible by the {rollout_dp} rollout "
        f"data-parallel ranks{over}",
    )
    require(
        n % train_dp == 0,
        f"batch_size x samples_per_prompt = {n} samples is not divisible by the {train_dp} train "
        f"data-parallel ranks{over}",
    )
    updates, micro = geometry.num_updates_per_batch, geometry.micro_batch_size
    per_rank = geometry.samples_per_train_rank
    # how the per-rank count came about, so the line names every knob that sets it
    split = (
        f"batch_size={geometry.prompts_per_rollout} prompts x sampling.samples_per_prompt="
        f"{geometry.samples_per_prompt} over {train_dp} train data-parallel rank(s)"
        + (
            f" (num_devices={cfg.num_devices} / parallel.sequence_parallel_size="
            f"{cfg.parallel.sequence_parallel_size})"
            if cfg.parallel.sequence_parallel_size > 1
            else ""
        )
    )
    require(
        per_rank % updates == 0,
        f"{per_rank} samples per train rank ({split}) cannot be split into "
        f"stack.num_updates_per_batch={updates} equal mini-batches",
    )
    require(
        (per_rank // updates) % micro == 0,
        f"a mini-batch of {per_rank // updates} samples per rank ({split}, "
        f"stack.num_updates_per_batch={updates}) is not divisible by "
        f"stack.micro_batch_size={micro}; change batch_size, num_devices or the stack's sizes",
    )


def _setting(cfg: RunConfig, name: str, key: str) -> object:
    """``<name>.<key>`` as the run will see it: the recipe's value, else the default that the
    block's ``_target_`` declares (read from its signature, not copied here)."""
    block = getattr(cfg, name) or {}
    if key in block:
        return block[key]
    if "_target_" not in block:
        return None
    param = inspect.signature(locate(str(block["_target_"]), name)).parameters.get(key)
    return None if param is None or param.default is param.empty else param.default


def check_drop_group_shards(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``reward.failure_policy=drop_group`` drops every sample of a prompt group on the reward
    rank that saw a failure. The driver scatters contiguous chunks of the rollout to the
    reward / rollout ranks and to the train ranks, so every chunk must hold whole groups."""
    if _setting(cfg, "reward", "failure_policy") != "drop_group":
        return
    geometry = BatchGeometry.of(cfg, objs)
    spp = geometry.samples_per_prompt
    for slab, dp, per_rank in (
        ("rollout", geometry.rollout_ranks, geometry.samples_per_rollout_rank),
        ("train", geometry.train_ranks, geometry.samples_per_train_rank),
    ):
        require(
            per_rank % spp == 0,
            f"reward.failure_policy=drop_group drops whole prompt groups, but batch_size={cfg.batch_size} "
            f"prompts over {dp} {slab} data-parallel ranks give {per_rank} samples per rank, not a "
            f"multiple of sampling.samples_per_prompt={spp}, so a group straddles two ranks; make "
            f"batch_size a multiple of {dp} or set reward.failure_policy=raise",
        )


def check_strategy_and_algorithm(cfg: RunConfig, objs: Mapping[str, Any]) -> None:
    strategy = objs.get("pipeline.strategy")
    needs_logp = bool(_algorithm_knob(cfg, "requires_log_prob"))
    if strategy is not None and needs_logp:
        require(
            declared(strategy, "provides_log_prob", "pipeline.strategy", "unirl.sde.SDEStrategy"),
            f"algorithm {_target(cfg, 'algorithm')} is ratio-based and needs per-step log-probs, but "
            f"pipeline.strategy {type(strategy).__name__} records none; use FlowSDE, CPS or DanceSDE",
        )
    sampling = objs.get("sampling")
    sde_steps = getattr(sampling, "sde_steps", None)
    if needs_logp and sde_steps is not None and hasattr(sde_steps, "select"):
        assert sampling is not None  # sde_steps was read from it
        try:
            chosen = sde_steps.select(sampling.num_inference_steps, seed=0, rollout_index=0)
        except ValueError as exc:
            raise ConfigError(f"sampling.sde_steps: {exc}") from exc
        require(len(chosen) >= 1, "sampling.sde_steps selects no step to train; widen its range")
        require(
            max(chosen) < sampling.num_inference_steps,
            f"sampling.sde_steps selects step {max(chosen)} but num_inference_steps={sampling.num_inference_steps}",
        )
    if sampling is not None and "group" in (cfg.advantage.scope, cfg.advantage.std):
        which = "advantage.scope" if cfg.advantage.scope == "group" else "advantage.std"
        require(
            sampling.samples_per_prompt >= 2,
            f"{which}=group needs sampling.samples_per_prompt >= 2: a group of one sample has "
            "zero advantage (scope=group) or zero std, which blows every advantage up to the "
            "clip (std=group); raise samples_per_prompt or set advantage.scope=global "
            "advantage.std=batch",
        )


def check_reference_policy(cfg: RunConfig, objs: Mapping[str, Any]) -> None:
    """A KL term (``algorithm.kl``, a ``KLConfig``; no block: no KL) needs the frozen base,
    which the backend reaches by disabling the LoRA adapter."""
    kl = objs.get("algorithm.kl")
    if kl is None or not kl.enabled:
        return
    require(
        objs.get("backend.lora") is not None,
        f"algorithm.kl.beta={kl.beta} > 0 takes the reference from the frozen base by disabling "
        "the LoRA adapter; set backend.lora or algorithm.kl.beta=0",
    )


def check_dynamic_sampling(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``dynamic_sampling.enabled`` (DAPO) joins groups of several generate calls on the
    driver: a text recipe (one trained stage), groups of at least two samples, and the
    rollout's tensors shipped to the driver (``rollout.resident: false``)."""
    if not cfg.dynamic_sampling.enabled:
        return
    require(
        cfg.entrypoint in (None, "unirl.train_vlm"),
        f"dynamic_sampling.enabled refills the batch of a text recipe's one trained stage; "
        f"{cfg.entrypoint} is not supported: set dynamic_sampling.enabled=false",
    )
    spp = BatchGeometry.of(cfg, objs).samples_per_prompt
    require(
        spp >= 2,
        f"dynamic_sampling.enabled keeps groups whose rewards differ, which a group of "
        f"sampling.samples_per_prompt={spp} never has; raise samples_per_prompt",
    )
    require(
        _setting(cfg, "rollout", "resident") is False,
        "dynamic_sampling.enabled joins the groups of several generate calls on the driver, "
        "so their tensors must come back to it: set rollout.resident=false",
    )


def check_value_head(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """A loss with a value head (PPO) needs the pipeline to attach it and, under LoRA, an
    adapter on it (the frozen base would never learn values)."""
    target = _target(cfg, "algorithm")
    if not target or not getattr(locate(target, "algorithm"), "requires_value_head", False):
        return
    require(
        _setting(cfg, "pipeline", "value_head") is True,
        f"{target} learns a value head on the policy's backbone: set pipeline.value_head=true",
    )
    lora = objs.get("backend.lora")
    if lora is not None:
        require(
            "value_head" in (getattr(lora, "targets", None) or []),
            f"{target} under LoRA trains the value head through an adapter: add value_head to "
            "backend.lora.targets (or set backend.lora=null)",
        )


def check_old_adapter_rollout(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """Algorithms that sample with an old / EMA adapter (DiffusionNFT) need that adapter and a
    sampler that samples it: the trainside engine switches to it; an external engine gets it
    from a ``LoraSync`` whose ``source_adapter`` is the old adapter."""
    if not _algorithm_knob(cfg, "requires_ema_rollout"):
        return
    target = _target(cfg, "algorithm")
    old = _setting(cfg, "algorithm", "old_adapter") or "old"
    kind = engine_kind(cfg)
    if kind != "trainside":
        # an external engine holds one adapter: the sync must move the old one to it
        source = _setting(cfg, "sync", "source_adapter") if cfg.sync is not None else None
        require(
            source == old,
            f"{target} samples with its old adapter {old!r}; rollout {kind} samples what the "
            f"sync moves (sync.source_adapter={source!r}): set sync.source_adapter={old} with "
            "sync._target_=unirl.distributed.weight_sync.LoraSync, or use "
            "rollout._target_=unirl.rollout.TrainsideEngine",
        )
        if int(getattr(cfg, "eval_interval", 0) or 0) > 0:
            print(
                f"[unirl] note: eval rollouts on the {kind} engine sample the old adapter {old!r} "
                "(the engine holds only what the sync moves), not the trained one",
                flush=True,
            )
    extra = getattr(objs.get("backend.lora"), "extra_adapters", None) or []
    require(
        old in extra,
        f"{target} rolls out with adapter {old!r}: set backend.lora.extra_adapters=[{old}]",
    )


def check_gather_for_sampling(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``backend.fsdp.gather_for_sampling`` gathers the trainer's sharded blocks for the
    rollout, which only the trainside engine samples with."""
    # _nested_configs builds backend.fsdp as the backend's FSDPConfig (absent: no fsdp block)
    if not getattr(objs.get("backend.fsdp"), "gather_for_sampling", False) or cfg.rollout is None:
        return
    require(
        engine_kind(cfg) == "trainside",
        f"backend.fsdp.gather_for_sampling gathers the trainer's blocks for sampling, but "
        f"rollout._target_={_target(cfg, 'rollout')} samples with its own weights; set "
        "gather_for_sampling=false or use unirl.rollout.TrainsideEngine",
    )


def check_token_budget(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """A token budget per micro-batch (``stack.max_tokens_per_micro_batch``, or the unified
    stack's ``stack.text.``) holds at least one whole sequence: a completion of
    ``sampling.max_new_tokens`` after a prompt of one token or more."""
    stack, sampling = objs.get("stack"), objs.get("sampling")
    max_new = getattr(sampling, "max_new_tokens", None)
    if max_new is None:
        return
    for key, owner in (("stack", stack), ("stack.text", getattr(stack, "text", None))):
        budget = getattr(owner, "max_tokens_per_micro_batch", None)
        if budget is None:
            continue
        require(
            budget > max_new,
            f"{key}.max_tokens_per_micro_batch={budget} is smaller than one sequence (a prompt "
            f"plus up to sampling.max_new_tokens={max_new} completion tokens), so every long "
            f"sequence would overrun it; raise it above the longest prompt + {max_new} (e.g. "
            f"{max_new + 512}) or lower sampling.max_new_tokens",
        )


def reward_component_names(block: object) -> list[str] | None:
    """The component names a ``RewardService`` block attaches (``component_rewards``), read from
    the block: a weighted backend's ``weights`` keys (which it requires to be exactly its
    components' names), a single scorer's ``name``; None when the block does not say."""
    backend = block.get("backend") if isinstance(block, dict) else None
    return _backend_names(backend, "reward.backend")


def _backend_names(backend: object, where: str) -> list[str] | None:
    """:func:`reward_component_names` of one backend block; a wrapper that scores with one
    inner reward (``PerFrame``'s ``scorer``, no name of its own) has the inner one's names."""
    if not isinstance(backend, dict) or "_target_" not in backend:
        return None
    weights = backend.get("weights")
    if isinstance(backend.get("components"), dict) and isinstance(weights, dict):
        return sorted(str(k) for k in weights)
    name = _setting_of(backend, where, "name")
    if isinstance(name, str) and name:
        return [name]
    return _backend_names(backend.get("scorer"), f"{where}.scorer")


def check_component_weights(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``advantage.component_weights`` names components the reward produces (a misspelt one
    used to fail on the first rollout)."""
    weights = cfg.advantage.component_weights
    known = reward_component_names(cfg.reward)
    if weights is None or known is None:
        return
    unknown = sorted(set(weights) - set(known))
    if not unknown:
        return
    import difflib

    close = {u: difflib.get_close_matches(u, known, n=1, cutoff=0.6) for u in unknown}
    hints = [f"{u!r} -> {c[0]!r}" for u, c in close.items() if c]
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    raise ConfigError(
        f"advantage.component_weights has key(s) {unknown} that the reward does not produce"
        f"{hint}; its components are {known}: use those names or set "
        "advantage.component_weights=null"
    )


def _setting_of(block: Mapping[str, object], where: str, key: str) -> object:
    """``block[key]``, else the default its ``_target_`` declares for ``key`` (a dataclass
    field or a signature parameter), else None."""
    if key in block:
        return block[key]
    target = locate(str(block["_target_"]), where)
    if dataclasses.is_dataclass(target):
        for f in dataclasses.fields(target):
            if f.name == key and f.default is not dataclasses.MISSING:
                return f.default
        return None
    try:
        param = inspect.signature(target).parameters.get(key)
    except (TypeError, ValueError):
        return None
    return None if param is None or param.default is param.empty else param.default


def check_component_hooks(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """Each component class may judge its own block before anything is built, with the whole
    recipe in view: ``check_config(block, recipe)`` (a classmethod; reads configs and files,
    never weights). The bundle checks its model path and image sizes, the backend its LoRA
    targets, a sync what the backend trains, an algorithm its knobs."""
    for name in COMPONENT_BLOCKS:
        block = getattr(cfg, name)
        if not isinstance(block, dict) or "_target_" not in block:
            continue
        hook = getattr(locate(str(block["_target_"]), name), "check_config", None)
        if callable(hook):
            hook(block, cfg)


def check_data(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """The prompt files exist (the data source's ``check_config`` hook parses them) and a
    ``resume`` folder exists."""
    path = (cfg.data_source or {}).get("path")
    if path:
        require(
            os.path.isfile(str(path)),
            f"data_source.path: prompt file {path!r} does not exist (set DATA_PATH or data_source.path)",
        )
    if cfg.eval.prompts_path:
        require(
            os.path.isfile(cfg.eval.prompts_path),
            f"eval.prompts_path: prompt file {cfg.eval.prompts_path!r} does not exist (give an "
            "existing file, or null to evaluate on the first prompts of data_source.path)",
        )
    if cfg.resume not in (None, "", "auto", "none", "null"):
        require(
            os.path.isdir(str(cfg.resume)),
            f"resume: checkpoint folder {cfg.resume!r} does not exist (use resume=auto, or a "
            "checkpoints/step_XXXXXX folder of an earlier run)",
        )


def check_output_dir(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """``output_dir`` is a folder this process can write (or create), and a fresh run never
    lands on an earlier run's history or checkpoints silently: it needs an empty (or new)
    ``output_dir``, ``resume`` to continue, or ``overwrite=true``."""
    root = Path(cfg.output_dir).expanduser()
    check_writable_folder(root, "output_dir")
    if cfg.resume not in (None, "", "none", "null") or cfg.overwrite:
        return
    found = [
        name
        for name in ("metrics.jsonl", "eval_metrics.jsonl", "checkpoints")
        if (root / name).exists() and (not (root / name).is_dir() or any((root / name).iterdir()))
    ]
    require(
        not found,
        f"output_dir {str(root)!r} already holds a run ({', '.join(found)}); pass resume=auto to "
        "continue it, overwrite=true to replace it, or another output_dir",
    )


def check_writable_folder(root: Path, key: str) -> None:
    """``root`` is a folder, or can be made one, that this process may write: refused in one
    line when it (or the nearest part of its path that exists) is a file or not writable."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == root else f"is under {str(existing)!r}, which is a file"
        raise ConfigError(
            f"{key} {str(root)!r} {where}, not a folder; give a folder (new or empty) for the "
            f"run to write, e.g. {key}=outputs/<name>"
        )
    writable = os.access(existing, os.W_OK | os.X_OK)
    if writable and hasattr(os, "geteuid") and os.geteuid() == 0:
        # root passes os.access on any local folder; a read-only mount still refuses it
        writable = not _read_only_mount(existing)
    require(
        writable,
        f"{key} {str(root)!r} is not writable by this user ({str(existing)!r} "
        f"{'is' if existing == root else 'would hold it and is'} read-only here); choose a "
        f"folder you can write, e.g. {key}=outputs/<name>",
    )


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_device(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    bundle_device = (cfg.bundle or {}).get("device")
    if bundle_device is not None:
        require(
            str(bundle_device).split(":")[0] == cfg.device,
            f"bundle.device={bundle_device!r} disagrees with device={cfg.device!r}; set one device for the run",
        )


# trackers whose package (and the unirl-mm extra that installs it) has the tracker's name
OPTIONAL_TRACKERS = ("tensorboard", "wandb")


def check_trackers(cfg: RunConfig, objs: Mapping[str, object]) -> None:
    """An optional tracker's package is installed (found, not imported), before the run's
    folder is written; a run on a Ray cluster logs from the driver, so this machine is the
    one that needs it."""
    import importlib.util

    for tracker in cfg.logging.trackers:
        require(
            tracker not in OPTIONAL_TRACKERS or importlib.util.find_spec(tracker) is not None,
            f"logging.trackers has {tracker!r} but the {tracker} package is not installed: "
            f"pip install 'unirl-mm[{tracker}]', or drop {tracker!r} from logging.trackers",
        )


CHECKS: tuple[Callable[[RunConfig, Mapping[str, object]], None], ...] = (
    check_required_blocks,
    check_layout_and_sync,
    check_sequence_parallel,
    check_updates_per_rollout,
    check_fp8_sampling,
    check_batch_geometry,
    check_drop_group_shards,
    check_strategy_and_algorithm,
    check_reference_policy,
    check_dynamic_sampling,
    check_value_head,
    check_old_adapter_rollout,
    check_gather_for_sampling,
    check_component_weights,
    check_token_budget,
    check_component_hooks,
    check_data,
    check_output_dir,
    check_device,
    check_trackers,
)


def validate(data: Mapping[str, object]) -> tuple[RunConfig, dict[str, Any]]:
    """Type the top level, check every block, run every cross-component check.

    Returns the ``RunConfig`` and the cheap objects built on the way, keyed by block:
    ``objs[name]`` is the typed config of a component that declares one (``"stack"`` ->
    ``TrainStackConfig``, ``"bundle"`` -> its bundle config), the instance of a dataclass
    block (``"sampling"``) or else the block itself; ``"<block>.<key>"`` are nested configs
    (``"pipeline.strategy"``, ``"algorithm.kl"``, ``"backend.lora"``, …). Callers print
    geometry from them without loading weights.
    """
    cfg = RunConfig.from_dict(data)
    objs: dict[str, Any] = {}
    for name in COMPONENT_BLOCKS:
        block = getattr(cfg, name)
        if block is None:
            continue
        checked = check_block(
            block, name, instantiate_dataclasses=(name == "sampling"), typed_component=True
        )
        objs[name] = checked
        if isinstance(block, dict):
            objs.update(_nested_configs(block, name))
    for check in CHECKS:
        check(cfg, objs)
    return cfg, objs
