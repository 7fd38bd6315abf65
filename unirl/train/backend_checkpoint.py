"""Checkpoints of an ``FSDPBackend``: the collective side of ``checkpoint.py``.

Every rank calls in; the trainable state, optimizer, LR schedule, EMA and the RNG states of
all ranks are gathered to rank 0, which alone touches the disk (``checkpoint.py`` holds the
directory format, the atomic write and the read). Loading runs the other way: rank 0 reads,
checks the checkpoint against the backend, and the state is broadcast and sharded again.
``FSDPBackend.save_checkpoint`` / ``load_checkpoint`` delegate here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from unirl.train import checkpoint as ckpt
from unirl.train.ema import ParamEMA
from unirl.train.lora import LoraConfig, adapter_parameter_names
from unirl.train.parallel import (
    broadcast_object,
    full_from_local,
    full_tensor,
    gather_objects,
    local_tensor,
    reshard,
    scatter_objects,
    shard_like,
)

_T = TypeVar("_T")


class CheckpointedBackend(Protocol):
    """What a checkpoint reads from and restores into (``FSDPBackend`` provides it)."""

    step: int  # restored by load_checkpoint

    @property
    def module(self) -> nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LambdaLR: ...

    @property
    def lora(self) -> LoraConfig | None: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def ema(self) -> ParamEMA | None: ...

    @property
    def adapters(self) -> list[str]: ...

    def named_trainable_parameters(self) -> list[tuple[str, nn.Parameter]]: ...

    def num_trainable_params(self) -> int: ...

    def zero_grad(self) -> None: ...


def run_on_rank0(rank: int, fn: Callable[[], _T]) -> _T | None:
    """Run ``fn`` on rank 0 (``None`` elsewhere); if it raises, every rank raises."""
    error: BaseException | None = None
    result: _T | None = None
    if rank == 0:
        try:
            result = fn()
        except BaseException as exc:
            error = exc
    status = broadcast_object(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if status is not None:
        raise ckpt.CheckpointError(f"rank 0 failed: {status}")
    return result


def checkpoint_meta(backend: CheckpointedBackend) -> dict[str, Any]:
    """What ``trainer_state.json`` records about the backend (besides format and files)."""
    return {
        "kind": "adapter" if backend.lora is not None else "full",
        "step": backend.step,
        "adapters": backend.adapters,
        "trained_adapter": backend.lora.adapter_name if backend.lora is not None else None,
        "has_ema": backend.ema is not None,
        "world_size": backend.world_size,
        "num_trainable_params": backend.num_trainable_params(),
    }


def state_dict_for_checkpoint(backend: CheckpointedBackend) -> dict[str, Any]:
    """``{"meta", "model", "ema", "optimizer", "scheduler"}`` with full (unsharded) CPU
    tensors on rank 0 and empty dicts on the others (a collective: call on every rank).
    ``model`` holds every adapter's parameters with LoRA, the full state dict without.
    Without sharding the tensors may alias live parameters: write them before training on."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    has_lora = backend.lora is not None
    trainable_names = [n for n, _ in backend.named_trainable_parameters()]
    reshard(backend.module)
    options = StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=has_lora
    )
    model_sd, optim_sd = get_state_dict(backend.module, backend.optimizer, options=options)
    model: dict[str, Any] = model_sd  # full CPU tensors on rank 0
    if has_lora:
        model = {n: model_sd[n] for n in trainable_names} if backend.rank == 0 else {}
        named = dict(backend.module.named_parameters())
        trainable = set(trainable_names)
        for n in adapter_parameter_names(backend.module):  # frozen adapters (NFT's "old")
            if n not in trainable:
                value = full_tensor(named[n])
                if backend.rank == 0:
                    model[n] = value.cpu()
    ema: dict[str, torch.Tensor] | None = None
    if backend.ema is not None:
        ema = {}
        for (n, p), shadow in zip(
            backend.named_trainable_parameters(), backend.ema.shadows, strict=True
        ):
            value = full_from_local(shadow, p)
            if backend.rank == 0:
                ema[n] = value.cpu()
    return {
        "meta": checkpoint_meta(backend),
        "model": model,
        "ema": ema,
        "optimizer": optim_sd,
        "scheduler": backend.scheduler.state_dict(),
    }


def save_checkpoint(
    backend: CheckpointedBackend, path: str | Path, *, extra: Mapping[str, object] | None = None
) -> Path:
    """Write a checkpoint to ``path`` atomically (rank 0 writes; call on every rank).
    ``extra`` must be ``torch.load(weights_only=True)``-safe: tensors, numbers, strings,
    lists, tuples, dicts."""
    payload = state_dict_for_checkpoint(backend)
    rng = gather_objects(ckpt.capture_rng_state())

    def write() -> Path:
        return ckpt.write_checkpoint(path, {**payload, "rng": rng, "extra": dict(extra or {})})

    run_on_rank0(backend.rank, write)
    return Path(path)


def load_checkpoint(backend: CheckpointedBackend, path: str | Path) -> dict[str, object]:
    """Restore parameters, optimizer, schedule, EMA, step and RNG from ``path`` (rank 0
    reads, then broadcasts and shards); returns the saved ``extra`` on every rank."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    payload = run_on_rank0(backend.rank, lambda: ckpt.read_checkpoint(path)) or {}
    meta = broadcast_object(payload.get("meta", {}))  # rank 0's
    _check_meta(backend, meta, payload, path)
    recipe = _recipe_hyperparameters(backend)
    backend.zero_grad()
    reshard(backend.module)
    # Two calls, not set_state_dict(model, optim): with broadcast_from_rank0, torch 2.13's
    # set_state_dict treats an empty model dict on ranks > 0 as "optimizer only" and skips
    # the model broadcast on them (checked: rank 1 kept its old values).
    options = StateDictOptions(
        full_state_dict=True,
        broadcast_from_rank0=backend.world_size > 1,
        strict=backend.lora is None,
    )
    set_model_state_dict(backend.module, payload.get("model", {}), options=options)
    set_optimizer_state_dict(
        backend.module, backend.optimizer, payload.get("optimizer", {}), options=options
    )
    if backend.ema is not None:
        _load_ema(backend, backend.ema, payload.get("ema"), bool(meta["has_ema"]))
    scheduler, extra = broadcast_object((payload.get("scheduler", {}), payload.get("extra", {})))
    backend.scheduler.load_state_dict(scheduler)
    _apply_recipe_hyperparameters(backend, recipe)
    backend.step = int(meta["step"])
    if int(meta["world_size"]) == backend.world_size:
        ckpt.restore_rng_state(scatter_objects(payload.get("rng")))
    else:
        warnings.warn(
            f"checkpoint {path} was written by {meta['world_size']} ranks, this run has "
            f"{backend.world_size}: RNG states are not restored",
            stacklevel=3,  # the caller of FSDPBackend.load_checkpoint
        )
    return dict(extra)


def _recipe_hyperparameters(backend: CheckpointedBackend) -> dict[str, Any]:
    """What the recipe set for the optimizer, read from the backend before the checkpoint
    loads: each group's base lr (the schedule's ``base_lrs``) and its other hyperparameters
    (weight decay, betas, eps); the checkpoint's copies of them must not win."""
    return {
        "base_lrs": list(backend.scheduler.base_lrs),
        "groups": [
            {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}
            for group in backend.optimizer.param_groups
        ],
    }


def _apply_recipe_hyperparameters(backend: CheckpointedBackend, recipe: dict[str, Any]) -> None:
    """After a load: the optimizer state (moments, step counts) and the schedule's position are
    the checkpoint's, the hyperparameters the recipe's. So a resume with a changed
    ``backend.optimizer.lr`` (announced as ``backend.optimizer.lr: 0.003 -> 0.001``) trains and
    logs at the new lr times the schedule's factor at the restored step."""
    scheduler = backend.scheduler
    scheduler.base_lrs = list(recipe["base_lrs"])
    factors = [fn(scheduler.last_epoch) for fn in scheduler.lr_lambdas]
    for group, base, knobs, factor in zip(
        backend.optimizer.param_groups, recipe["base_lrs"], recipe["groups"], factors, strict=True
    ):
        group.update(knobs)
        group["initial_lr"] = base
        group["lr"] = base * factor
    scheduler._last_lr = [group["lr"] for group in backend.optimizer.param_groups]


def _check_meta(
    backend: CheckpointedBackend, meta: dict[str, Any], payload: dict[str, Any], path: str | Path
) -> None:
    kind = "adapter" if backend.lora is not None else "full"
    if meta["kind"] != kind:
        raise ckpt.CheckpointError(
            f"checkpoint {path} is {meta['kind']!r}, this backend trains {kind!r}"
        )
    if backend.lora is not None and sorted(meta["adapters"]) != backend.adapters:
        raise ckpt.CheckpointError(
            f"checkpoint {path} has adapters {meta['adapters']}, this backend {backend.adapters} "
            "(lora.adapter_name / lora.extra_adapters)"
        )
    problem = None
    if backend.rank == 0:  # only rank 0 holds the tensors; every rank must raise together
        saved = payload.get("model", {})
        if backend.lora is not None:
            expected = set(adapter_parameter_names(backend.module))
            got = set(saved)
            if got != expected:
                problem = (
                    f"checkpoint {path}: adapter tensors differ from this model's (lora.targets?); "
                    f"missing {sorted(expected - got)[:5]}, unexpected {sorted(got - expected)[:5]}"
                )
        if problem is None:
            problem = _shape_problem(backend, saved, path)
    problem = broadcast_object(problem)
    if problem is not None:
        raise ckpt.CheckpointError(problem)
    has_ema = backend.ema is not None
    if meta["has_ema"] != has_ema:
        warnings.warn(
            f"checkpoint {path} has_ema={meta['has_ema']}, backend has_ema={has_ema}: "
            + ("EMA restarts from the loaded weights" if has_ema else "the saved EMA is ignored"),
            stacklevel=4,  # the caller of FSDPBackend.load_checkpoint
        )


def _shape_problem(
    backend: CheckpointedBackend, saved: dict[str, Any], path: str | Path
) -> str | None:
    """The saved tensors whose shapes differ from this model's parameters (global shapes,
    sharded or not), named with the knobs that set them; ``None`` when all fit."""
    here = dict(backend.module.named_parameters())
    wrong = [
        (name, tuple(tensor.shape), tuple(here[name].shape))
        for name, tensor in saved.items()
        if name in here and tuple(tensor.shape) != tuple(here[name].shape)
    ]
    if not wrong:
        return None
    name, then, now = wrong[0]
    more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
    knobs = "backend.lora.rank" if backend.lora is not None else "the model's config"
    return (
        f"checkpoint {path} does not fit this model: {name} is {list(then)} there, {list(now)} "
        f"here{more}; resume with the recipe that wrote it ({knobs} differs from that run's)"
    )


@torch.no_grad()
def _load_ema(
    backend: CheckpointedBackend,
    ema: ParamEMA,
    saved: dict[str, torch.Tensor] | None,
    has_saved: bool,
) -> None:
    named = backend.named_trainable_parameters()
    rank = backend.rank
    if has_saved:  # rank 0 holds the tensors; every rank must raise together
        lacking = [n for n, _ in named if n not in (saved or {})] if rank == 0 else None
        lacking = broadcast_object(lacking)
        if lacking:
            raise ckpt.CheckpointError(
                f"checkpoint EMA lacks {len(lacking)} trainable tensors, e.g. {lacking[:3]}"
            )
    for i, (n, p) in enumerate(named):
        if has_saved:
            value = shard_like(saved[n] if saved is not None and rank == 0 else None, p)
        else:
            value = local_tensor(p)
        ema.shadows[i].copy_(value)
