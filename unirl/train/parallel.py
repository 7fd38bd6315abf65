"""Parallelism for the trainable module: activation checkpointing and FSDP2, plus the few
collective helpers the backend needs (full / local views of sharded tensors, object broadcast).

``FSDPBackend`` applies these in one fixed order (see ``backend.py``): activation checkpointing
per block, then ``fully_shard`` per block, then ``fully_shard`` on the root.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import checkpoint

from unirl.config import require
from unirl.config.precision import canonical_precision, parse_dtype

_T = TypeVar("_T")

_AC_MARKER = "_unirl_activation_checkpointed"


@dataclass(kw_only=True)
class FSDPConfig:
    """FSDP2 / activation-checkpointing knobs of :class:`~unirl.train.FSDPBackend`.

    ``block_class_names``: class names of the modules sharded (and checkpointed) one by one;
    ``None`` takes the bundle's ``block_class_names`` (SD3: ``JointTransformerBlock``).
    ``param_dtype`` is FSDP's compute dtype for all-gathered parameters (``None``: as stored);
    ``reduce_dtype`` the gradient reduce-scatter dtype. ``cpu_offload`` is FSDP2's
    ``CPUOffloadPolicy`` (sharded parameters, gradients and optimizer step live on CPU); it
    needs a sharded run (world > 1) on CUDA. ``compile`` compiles each block's forward with
    ``torch.compile`` (regional compilation: one graph per block class, shared by every block,
    used by rollout and training alike because trainside sampling runs the same module).
    ``compile_dynamic``: ``false`` compiles one graph per input shape (diffusion: a few fixed
    shapes); ``null`` is dynamo's automatic dynamic shapes, one static graph first and one
    symbolic-shape graph once a shape changes; ``true`` compiles symbolic shapes at once. A
    text model's GRPO micro-batches change width and row count every step, and ``null`` still
    recompiled there (docs/performance.md: 1,521 trained tokens/s against 7,140 eager), so
    compile a text model only at fixed shapes (the Qwen3-4B bench: 1.85x eager). ``family``
    (the default) takes the bundle's ``compile_dynamic``: ``true`` for families whose joint
    sequence length follows each prompt's text length (Qwen-Image, Z-Image), where static
    shapes compiled new graphs inside every step and ``null`` compiled its symbolic graph in
    the first step that met a new length (docs/performance.md, calls 14-15); ``false`` for
    the others and for a bundle that declares nothing.
    ``inductor_options``: ``torch._inductor.config`` settings made in the worker before the
    blocks compile (process-wide there; for example ``{combo_kernels: true}``, Inductor's
    horizontal fusion of small independent kernels such as a LoRA's per-tensor casts); each
    name must be one of that module's settings.
    ``reshard_after_forward`` frees each block's gathered parameters after its forward (FSDP2's
    default: less memory, a second all-gather for the backward); ``false`` keeps them until
    the backward (with ``shard`` only). ``activation_checkpointing`` recomputes each block's
    activations in the backward instead of keeping them (less memory, one more forward).
    ``shard_frozen=False`` keeps frozen parameters (a LoRA run's base model) whole on every
    rank and shards only the trainable ones: no all-gather of the base in any forward, at the
    cost of one full base copy per rank.
    ``gather_for_sampling`` (``shard``, trainside engine): while the trainer samples a rollout
    (between ``begin_sampling`` and ``end_sampling``) every block and the root keep their
    gathered parameters after a forward, so a rollout all-gathers them once instead of once
    per denoising step; they are resharded when sampling ends. It costs the whole trained
    module's parameters on every rank for the whole rollout (prompt encoding, denoising and
    decode; both experts of a two-expert Wan 2.2), and with ``cpu_offload`` it puts them on
    the device for that time.
    ``data_parallel``: ``shard`` (FSDP2 as above) or ``replicate`` (no FSDP: every rank holds
    the whole module, parameters are broadcast from rank 0 once, and the gradients are
    averaged with one bucketed all-reduce per optimizer step). ``replicate`` suits LoRA,
    whose trainable part is small: no collective inside any forward or backward.
    """

    block_class_names: list[str] | None = None
    reshard_after_forward: bool = True
    param_dtype: str | None = None
    reduce_dtype: str | None = "fp32"
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    compile: bool = False
    compile_dynamic: bool | str | None = "family"
    inductor_options: dict[str, object] | None = None
    shard_frozen: bool = True
    data_parallel: str = "shard"
    gather_for_sampling: bool = False

    def __post_init__(self) -> None:
        require(
            self.compile_dynamic in (True, False, None, "family"),
            "fsdp.compile_dynamic must be true, false, null or family (the bundle's), got "
            f"{self.compile_dynamic!r}",
        )
        require(
            self.data_parallel in ("shard", "replicate"),
            f"fsdp.data_parallel must be 'shard' or 'replicate', got {self.data_parallel!r}",
        )
        require(
            not self.gather_for_sampling or self.data_parallel == "shard",
            "fsdp.gather_for_sampling keeps sharded blocks gathered while the trainer samples; "
            "with data_parallel=replicate every rank already holds them: set it to false",
        )
        if self.inductor_options is not None:
            import torch._inductor.config as inductor_config

            self.inductor_options = dict(self.inductor_options)
            unknown = sorted(k for k in self.inductor_options if not hasattr(inductor_config, k))
            require(
                not unknown,
                f"fsdp.inductor_options names {unknown}, which torch._inductor.config (torch "
                f"{torch.__version__}) does not have; check the spelling against that module",
            )
            require(self.compile, "fsdp.inductor_options is set but fsdp.compile is false")
        if self.block_class_names is not None:
            self.block_class_names = list(self.block_class_names)
            require(
                bool(self.block_class_names)
                and all(isinstance(n, str) and n for n in self.block_class_names),
                "fsdp.block_class_names must be a non-empty list of class names (or null for the bundle's)",
            )
        if self.param_dtype is not None:
            self.param_dtype = canonical_precision(self.param_dtype, "fsdp.param_dtype")
        if self.reduce_dtype is not None:
            self.reduce_dtype = canonical_precision(self.reduce_dtype, "fsdp.reduce_dtype")


def world_info() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class SequenceParallelGroup:
    """This rank's sequence-parallel group: the process group, its size and this rank's
    index in it (the fields ``models.common.sequence_parallel.SequenceParallel`` has, which
    the bundle's ``enable_sequence_parallel`` reads; ``train`` does not import ``models``)."""

    group: ProcessGroup | None
    size: int
    rank: int


def new_sequence_parallel_group(size: int) -> SequenceParallelGroup:
    """Split the default group into SP groups of ``size`` consecutive ranks (the rank
    layout of ``distributed.group.rank``: ``sp`` inside ``dp``, ``rank = dp_rank * size +
    sp_rank``) and return this rank's. A collective: every rank creates every group, in
    the same order."""
    rank, world = world_info()
    require(
        world % size == 0,
        f"sequence_parallel_size={size} does not divide the {world} ranks of the default "
        "process group; use a device count that is a multiple of it",
    )
    own = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            own = group
    return SequenceParallelGroup(group=own, size=size, rank=rank % size)


def find_blocks(module: nn.Module, class_names: Iterable[str]) -> list[nn.Module]:
    """Modules of ``module`` whose class name is in ``class_names`` (outermost first order).

    Raises ``ConfigError`` listing the class names present when none matches.
    """
    names = set(class_names)
    blocks = [m for m in module.modules() if type(m).__name__ in names]
    if not blocks:
        present = sorted({type(m).__name__ for m in module.modules()})
        require(
            False,
            f"fsdp.block_class_names={sorted(names)} matches no module of {type(module).__name__}; "
            f"class names present: {present[:40]}",
        )
    return blocks


def apply_activation_checkpointing(blocks: Iterable[nn.Module]) -> None:
    """Recompute each block's activations in backward (``torch.utils.checkpoint``, non-reentrant).

    The block's ``forward`` is wrapped in place instead of wrapping the module in a new parent:
    parameter names (state dicts, peft keys, exported LoRA) stay exactly as they were. Without
    grad (rollout, reference passes) the plain forward runs.
    """
    for block in blocks:
        if getattr(block, _AC_MARKER, False):
            continue
        inner = block.forward

        def forward(*args: object, _inner: Callable[..., object] = inner, **kwargs: Any) -> object:
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward  # instance attribute; nn.Module.__call__ dispatches to it
        setattr(block, _AC_MARKER, True)


COMPILE_RECOMPILE_LIMIT = 64


def compile_dynamic_of(cfg: FSDPConfig, bundle: object) -> bool | None:
    """The ``dynamic`` the blocks compile with: ``cfg.compile_dynamic``, or for ``family`` the
    bundle's ``compile_dynamic`` (``False`` when it declares none)."""
    if cfg.compile_dynamic != "family":
        return cast("bool | None", cfg.compile_dynamic)
    value = getattr(bundle, "compile_dynamic", False)
    require(
        value in (True, False, None),
        f"{type(bundle).__name__}.compile_dynamic must be True, False or None, got {value!r}",
    )
    return cast("bool | None", value)


def apply_compile(
    blocks: Iterable[nn.Module],
    inductor_options: Mapping[str, object] | None = None,
    dynamic: bool | None = False,
) -> None:
    """``torch.compile`` each block in place (``nn.Module.compile``): names stay unchanged.

    ``inductor_options`` are set on ``torch._inductor.config`` first (process-wide).
    Block variants (SD3.5's dual-attention blocks, the context-only last block) times grad
    mode times adapter on/off exceed dynamo's default of 8 graphs per code object, after
    which it silently runs eager; the limit is raised so every variant stays compiled.
    """
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(
                torch._dynamo.config,
                name,
                max(getattr(torch._dynamo.config, name), COMPILE_RECOMPILE_LIMIT),
            )
    if inductor_options:
        import torch._inductor.config as inductor_config

        for key, value in inductor_options.items():
            setattr(inductor_config, key, value)
    for block in blocks:
        block.compile(dynamic=dynamic)


def apply_fsdp(
    module: nn.Module, blocks: list[nn.Module], cfg: FSDPConfig, device: torch.device
) -> None:
    """``fully_shard`` each block, then the root, over a 1-D mesh of all ranks.

    Needs torch.distributed initialised (gloo on CPU works, NCCL on CUDA).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    _, world = world_info()
    mesh = init_device_mesh(device.type, (world,))
    mp_policy = MixedPrecisionPolicy(
        param_dtype=parse_dtype(cfg.param_dtype, "fsdp.param_dtype") if cfg.param_dtype else None,
        reduce_dtype=parse_dtype(cfg.reduce_dtype, "fsdp.reduce_dtype")
        if cfg.reduce_dtype
        else None,
    )
    offload = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
    # frozen base weights only: frozen adapter copies ("old") stay sharded like their source
    ignored = (
        None
        if cfg.shard_frozen
        else {p for n, p in module.named_parameters() if not p.requires_grad and "lora_" not in n}
    )
    for part in [*blocks, module]:
        fully_shard(
            part,
            mesh=mesh,
            mp_policy=mp_policy,
            offload_policy=offload,
            reshard_after_forward=cfg.reshard_after_forward,
            ignored_params=ignored,
        )


GRAD_BUCKET_BYTES = 256 * 2**20


@torch.no_grad()
def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Every parameter and buffer of ``module`` takes rank ``src``'s value (replicate mode)."""
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=src)


@torch.no_grad()
def all_reduce_grads(params: list[nn.Parameter]) -> None:
    """Average the gradients of ``params`` over all ranks, flattened into buckets of at most
    ``GRAD_BUCKET_BYTES`` (one all-reduce per bucket).

    Which parameters have a gradient is agreed first (one small all-reduce): a parameter no
    rank touched keeps ``grad=None`` (the optimizer skips it, as in one process); one that
    only some ranks touched counts as zeros on the others.
    """
    device = params[0].device if params else torch.device("cpu")
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=device)
    dist.all_reduce(present)
    world = dist.get_world_size()
    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        if not bucket:
            return
        flat = torch._utils._flatten_dense_tensors(bucket)
        dist.all_reduce(flat)
        flat.div_(world)
        for g, reduced in zip(
            bucket, torch._utils._unflatten_dense_tensors(flat, bucket), strict=True
        ):
            g.copy_(reduced)
        bucket.clear()

    for p, anywhere in zip(params, present.tolist(), strict=True):
        if not anywhere:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        nbytes = g.numel() * g.element_size()
        if bucket and (size + nbytes > GRAD_BUCKET_BYTES or g.dtype != bucket[0].dtype):
            flush()
            size = 0
        bucket.append(g)
        size += nbytes
    flush()


def reshard(module: nn.Module) -> None:
    """Free any unsharded FSDP parameters, so the next forward all-gathers the current shards.

    Call before editing sharded parameters in place (EMA swap, adapter copy, checkpoint load):
    with ``reshard_after_forward=False`` a no-grad forward leaves stale unsharded copies.
    """
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's storage of ``t`` (the local shard of a DTensor; ``t`` itself otherwise).

    In-place edits of the result under ``torch.no_grad()`` edit the parameter.
    """
    if isinstance(t, DTensor):
        return t.to_local()
    return t.data if isinstance(t, nn.Parameter) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A new tensor with the whole (unsharded) value of ``t`` on every rank (never an alias of
    ``t``'s storage); a collective for DTensors."""
    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t.clone()


def full_from_local(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Gather a tensor sharded exactly like ``like`` (e.g. an EMA shard) to its full value
    (a new tensor); a collective for DTensors."""
    if not isinstance(like, DTensor):
        return local.detach().clone()
    dt = DTensor.from_local(
        local,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )
    return dt.full_tensor()


def shard_like(full: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of rank 0's ``full`` tensor, sharded like ``like`` (a collective for
    DTensors and for replicated tensors across ranks; other ranks may pass ``None``).
    Returns a plain local tensor. Rank 0 must hold a value: callers check that on every rank
    together first (a rank-0-only error here would leave the others in the collective)."""
    rank, world = world_info()
    if rank == 0:
        require(full is not None, "shard_like: rank 0 has no value for this tensor")
    if not isinstance(like, DTensor):
        if world == 1:
            assert full is not None
            return full
        out = torch.empty_like(like.detach())
        if rank == 0:
            assert full is not None
            out.copy_(full)
        dist.broadcast(out, src=0)
        return out
    local = like.to_local()
    if full is None or rank != 0:
        full = torch.empty(like.shape, dtype=local.dtype, device=local.device)
    full = full.to(device=local.device, dtype=local.dtype)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=0).to_local()


def broadcast_object(obj: _T) -> _T:
    """Rank 0's ``obj`` on every rank (identity when not distributed)."""
    _, world = world_info()
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: _T) -> list[_T] | None:
    """Every rank's ``obj`` as a list on rank 0 (``None`` elsewhere)."""
    rank, world = world_info()
    if world == 1:
        return [obj]
    out: list[object] | None = [None] * world if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return cast("list[_T] | None", out)  # filled with every rank's obj


def scatter_objects(objs: list[_T] | None) -> _T:
    """Rank ``r`` receives ``objs[r]`` from rank 0."""
    rank, world = world_info()
    if world == 1:
        require(objs is not None, "scatter_objects: rank 0 needs the list")
        assert objs is not None  # the require above refuses None
        return objs[0]
    out: list[object] = [None]
    dist.scatter_object_list(out, objs if rank == 0 else None, src=0)
    return cast("_T", out[0])  # rank 0's objs[rank]


def barrier() -> None:
    if world_info()[1] > 1:
        dist.barrier()
