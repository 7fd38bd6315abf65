"""Ulysses sequence parallelism for the video transformers, written once.

A sequence-parallel (SP) group of ``P`` ranks runs one batch together: everything outside the
transformer (encoding, the SDE step, log-probs, the loss) is replicated on the ``P`` ranks —
the same rows, so the same driver-authored x_T and SDE noise per sample id — and inside it
each rank holds ``1/P`` of the video tokens. Around every self- (or joint video+text)
attention an all-to-all swaps the sequence shard for a head shard (``[B, L/P, H, D]`` ->
``[B, L, H/P, D]``), the attention runs over the whole sequence on ``H/P`` heads, and the
inverse all-to-all swaps back. Text tokens of a joint attention are replicated: each rank
takes its ``H/P`` heads of them and the heads are gathered again after the attention.
Cross-attention (video queries, text keys) needs no communication: its queries stay local.

Where the sequence is split and gathered is the family's :class:`ShardPlan` (the rotary
table and the first block's input are split, ``proj_out``'s output is gathered), installed as
module hooks by :func:`enable_sequence_parallel`; the attention itself is diffusers' own call
(``dispatch_attention_fn`` of the family's transformer module), entered through a wrapper that
acts only inside the plan's attention modules.

Gradients (docs/math.md, *Sequence parallelism*): the loss is replicated, so each collective's
backward is chosen so that every rank's parameter gradient is a *partial* one whose mean over
the SP group is the single-rank gradient: a split's backward zero-pads, a gather's sums over
the group and keeps the local slice, an all-to-all's is the inverse all-to-all. The data-
parallel mean FSDP2 takes over all ranks (SP groups inside the data-parallel mesh) is then
the mean over SP ranks and over data-parallel groups at once: nothing else changes.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx
from torch.utils.hooks import RemovableHandle

MaskKind = Literal["none", "key", "pair"]


@dataclass(frozen=True)
class SequenceParallel:
    """One SP group: its process group (None: the default group), size and this rank's
    index in it."""

    group: dist.ProcessGroup | None
    size: int
    rank: int

    @classmethod
    def of(cls, group: dist.ProcessGroup | None = None) -> SequenceParallel:
        """The SP group ``group`` (None: the whole default group) as this rank sees it."""
        return cls(group=group, size=dist.get_world_size(group), rank=dist.get_rank(group))


# -- collectives with the partial-gradient backward ----------------------------------------------


def _all_to_all(
    x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    """Chunk ``x`` in ``P`` along ``scatter_dim``, send chunk ``i`` to rank ``i``, and
    concatenate the received chunks (in rank order) along ``gather_dim``."""
    send = torch.stack(x.chunk(sp.size, dim=scatter_dim))  # one copy: stack reads the views
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=sp.group)
    return torch.cat(list(recv.unbind(0)), dim=gather_dim)


class _CollectiveCtx(FunctionCtx):
    """What the collectives' forwards save on autograd's ``ctx`` for their backwards."""

    sp: SequenceParallel
    scatter: int
    gather: int
    dim: int
    full: int


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: _CollectiveCtx, x: torch.Tensor, sp: SequenceParallel, scatter: int, gather: int
    ) -> torch.Tensor:
        ctx.sp, ctx.scatter, ctx.gather = sp, scatter, gather
        return _all_to_all(x, sp, scatter, gather)

    @staticmethod
    def backward(ctx: _CollectiveCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _all_to_all(grad, ctx.sp, ctx.gather, ctx.scatter), None, None, None


class _Split(torch.autograd.Function):
    """Replicated -> this rank's slice along ``dim``; backward zero-pads (a partial gradient)."""

    @staticmethod
    def forward(
        ctx: _CollectiveCtx, x: torch.Tensor, sp: SequenceParallel, dim: int
    ) -> torch.Tensor:
        ctx.sp, ctx.dim, ctx.full = sp, dim, x.shape[dim]
        return x.chunk(sp.size, dim=dim)[sp.rank].contiguous()

    @staticmethod
    def backward(ctx: _CollectiveCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        sp, dim = ctx.sp, ctx.dim
        shape = list(grad.shape)
        shape[dim] = ctx.full
        out = grad.new_zeros(shape)
        out.narrow(dim, sp.rank * grad.shape[dim], grad.shape[dim]).copy_(grad)
        return out, None, None


class _Gather(torch.autograd.Function):
    """Shards along ``dim`` -> the whole tensor on every rank; backward sums the (partial)
    gradients over the group and keeps this rank's slice."""

    @staticmethod
    def forward(
        ctx: _CollectiveCtx, x: torch.Tensor, sp: SequenceParallel, dim: int
    ) -> torch.Tensor:
        ctx.sp, ctx.dim = sp, dim
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: _CollectiveCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.sp.group)
        return grad.chunk(ctx.sp.size, dim=ctx.dim)[ctx.sp.rank].contiguous(), None, None


def all_to_all(
    x: torch.Tensor, sp: SequenceParallel, *, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    """The Ulysses exchange (autograd: its backward is the inverse exchange)."""
    return _AllToAll.apply(x, sp, scatter_dim, gather_dim)


def split(x: torch.Tensor, sp: SequenceParallel, dim: int) -> torch.Tensor:
    """This rank's ``1/P`` of a replicated ``x`` along ``dim`` (must divide)."""
    if x.shape[dim] % sp.size:
        raise ValueError(
            f"sequence parallelism: {x.shape[dim]} positions along dim {dim} do not split over "
            f"{sp.size} ranks; choose a frame count / size whose token count (or head count) "
            "is a multiple of the SP size"
        )
    return _Split.apply(x, sp, dim)


def gather(x: torch.Tensor, sp: SequenceParallel, dim: int) -> torch.Tensor:
    """The shards of every rank along ``dim``, in rank order, on every rank."""
    return _Gather.apply(x, sp, dim)


# -- Ulysses attention --------------------------------------------------------------------------


def ulysses_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    *,
    sp: SequenceParallel,
    video_tokens: int,
    mask_kind: MaskKind,
    attend: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """Attention over the whole sequence from this rank's ``query/key/value[B, l + T, H, D]``
    (``l = video_tokens`` local video tokens first, then ``T`` replicated text tokens);
    returns this rank's ``[B, l + T, H, D]`` output. ``attend(q, k, v, mask)`` is the
    family's attention on ``[B, L, H/P, D]``. ``mask_kind``: ``none``; ``key`` (a
    ``[B, 1, 1, L·P + T]`` key mask over the whole sequence, as built before the blocks);
    ``pair`` (a ``[B, 1, l + T, l + T]`` mask built from local lengths, rebuilt here for the
    whole sequence from its diagonal)."""
    heads = query.shape[2]
    if heads % sp.size:
        raise ValueError(
            f"sequence parallelism: {heads} attention heads do not split over {sp.size} ranks "
            "(Ulysses needs the head count to be a multiple of the SP size)"
        )
    text = query.shape[1] - video_tokens
    full_video = video_tokens * sp.size

    def whole(x: torch.Tensor) -> torch.Tensor:
        v = all_to_all(x[:, :video_tokens], sp, scatter_dim=2, gather_dim=1)
        if text == 0:
            return v
        return torch.cat([v, split(x[:, video_tokens:], sp, 2)], dim=1)

    q, k, v = whole(query), whole(key), whole(value)
    mask = attn_mask
    if mask_kind == "pair" and attn_mask is not None:
        valid = attn_mask[:, 0].diagonal(dim1=-2, dim2=-1)  # [B, l + T]: m_i & m_i = m_i
        valid = torch.cat([valid.new_ones(valid.shape[0], full_video), valid[:, video_tokens:]], 1)
        mask = (valid[:, None, :, None] & valid[:, None, None, :]).bool()
    elif mask_kind == "key" and attn_mask is not None and attn_mask.shape[-1] != q.shape[1]:
        raise ValueError(
            f"sequence parallelism: a key mask over {attn_mask.shape[-1]} tokens for a sequence "
            f"of {q.shape[1]}"
        )
    out = attend(q, k, v, mask)  # [B, L + T, H/P, D]
    video = all_to_all(out[:, :full_video], sp, scatter_dim=1, gather_dim=2)
    if text == 0:
        return video
    return torch.cat([video, gather(out[:, full_video:], sp, 2)], dim=1)


# -- the family plans ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardPlan:
    """Where one transformer class splits and gathers its video tokens.

    ``attention_module``: the diffusers module whose ``dispatch_attention_fn`` its processors
    call; ``rope`` / ``rope_dim``: the rotary module and the sequence dim of each tensor it
    returns; ``first_block``: the block whose ``hidden_states`` input is split (dim 1);
    ``output``: the per-token module whose output is gathered (dim 1); ``self_attention``:
    whether an ``Attention`` module (by qualified name) is a self / joint one (Ulysses) — the
    others (cross-attention, the text refiner) run as they are; ``mask_kind``: see
    :func:`ulysses_attention`."""

    attention_module: str
    rope: str
    rope_dim: int
    first_block: str
    output: str
    self_attention: Callable[[str], bool]
    mask_kind: MaskKind


def _in_blocks(*prefixes: str, leaf: str) -> Callable[[str], bool]:
    def accept(name: str) -> bool:
        return name.startswith(prefixes) and name.endswith(leaf)

    return accept


PLANS: dict[str, ShardPlan] = {
    "WanTransformer3DModel": ShardPlan(
        attention_module="diffusers.models.transformers.transformer_wan",
        rope="rope",
        rope_dim=1,  # [1, L, 1, D]
        first_block="blocks.0",
        output="proj_out",
        self_attention=_in_blocks("blocks.", leaf=".attn1"),
        mask_kind="none",
    ),
    "HunyuanVideoTransformer3DModel": ShardPlan(
        attention_module="diffusers.models.transformers.transformer_hunyuan_video",
        rope="rope",
        rope_dim=0,  # [L, D]
        first_block="transformer_blocks.0",
        output="proj_out",
        self_attention=_in_blocks(
            "transformer_blocks.", "single_transformer_blocks.", leaf=".attn"
        ),
        mask_kind="key",
    ),
    "HunyuanVideo15Transformer3DModel": ShardPlan(
        attention_module="diffusers.models.transformers.transformer_hunyuan_video15",
        rope="rope",
        rope_dim=0,  # [L, D]
        first_block="transformer_blocks.0",
        output="proj_out",
        self_attention=_in_blocks("transformer_blocks.", leaf=".attn"),
        mask_kind="pair",
    ),
}


@dataclass
class _Active:
    sp: SequenceParallel
    plan: ShardPlan
    video_tokens: int = 0


# the SP state of the attention call in progress (set by the hooks of a plan's attention
# modules); the dispatch wrapper passes every other call through unchanged
_CURRENT: contextvars.ContextVar[_Active | None] = contextvars.ContextVar(
    "unirl_ulysses", default=None
)
_WRAPPED: dict[str, Callable[..., torch.Tensor]] = {}


def _install_dispatch(module_name: str) -> None:
    """Wrap ``dispatch_attention_fn`` of a diffusers transformer module once."""
    if module_name in _WRAPPED:
        return
    module = importlib.import_module(module_name)
    original = module.dispatch_attention_fn

    def dispatch(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: object, **kwargs: object
    ) -> torch.Tensor:
        active = _CURRENT.get()
        if active is None:
            return original(query, key, value, *args, **kwargs)
        if args:
            raise TypeError(
                "sequence parallelism: dispatch_attention_fn takes keywords after q, k, v"
            )
        mask = kwargs.pop("attn_mask", None)
        if mask is not None and not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"sequence parallelism: attn_mask must be a tensor or None, got {type(mask).__name__}"
            )

        def attend(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None
        ) -> torch.Tensor:
            return original(q, k, v, attn_mask=m, **kwargs)

        return ulysses_attention(
            query,
            key,
            value,
            mask,
            sp=active.sp,
            video_tokens=active.video_tokens,
            mask_kind=active.plan.mask_kind,
            attend=attend,
        )

    _WRAPPED[module_name] = original
    module.dispatch_attention_fn = dispatch


def plan_of(transformer: torch.nn.Module) -> ShardPlan:
    """The :class:`ShardPlan` of ``transformer`` (its class or, under FSDP2 / peft, the first
    class in its MRO that has one)."""
    for cls in type(transformer).__mro__:
        if cls.__name__ in PLANS:
            return PLANS[cls.__name__]
    raise ValueError(
        f"sequence parallelism has no shard plan for {type(transformer).__name__}; known: "
        f"{sorted(PLANS)} (set parallel sizes to 1 for other families)"
    )


@dataclass
class SequenceParallelHandle:
    """The hooks :func:`enable_sequence_parallel` installed; ``remove()`` undoes them."""

    hooks: list[RemovableHandle] = dataclasses.field(default_factory=list)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks.clear()


def enable_sequence_parallel(
    transformer: torch.nn.Module, sp: SequenceParallel
) -> SequenceParallelHandle:
    """Make ``transformer``'s forward sequence-parallel over ``sp``: it still takes the whole
    (replicated) input and returns the whole output on every rank of the group. A size-1
    group changes nothing (no hooks)."""
    handle = SequenceParallelHandle()
    if sp.size == 1:
        return handle
    plan = plan_of(transformer)
    _install_dispatch(plan.attention_module)
    state = _Active(sp=sp, plan=plan)
    modules = dict(transformer.named_modules())
    for name in (plan.rope, plan.first_block, plan.output):
        if name not in modules:
            raise ValueError(f"sequence parallelism: {type(transformer).__name__} has no {name!r}")

    def split_rope(
        _m: torch.nn.Module,
        _args: tuple[object, ...],
        out: torch.Tensor | tuple[torch.Tensor, ...],
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        parts = out if isinstance(out, tuple) else (out,)
        local = tuple(p.chunk(sp.size, dim=plan.rope_dim)[sp.rank] for p in parts)
        return local if isinstance(out, tuple) else local[0]

    def split_input(
        _m: torch.nn.Module, args: tuple[torch.Tensor, ...], kwargs: dict[str, torch.Tensor]
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        if "hidden_states" in kwargs:
            hidden = split(kwargs["hidden_states"], sp, 1)
            state.video_tokens = hidden.shape[1]
            return args, {**kwargs, "hidden_states": hidden}
        hidden = split(args[0], sp, 1)
        state.video_tokens = hidden.shape[1]
        return (hidden, *args[1:]), kwargs

    def gather_output(
        _m: torch.nn.Module, _args: tuple[object, ...], out: torch.Tensor
    ) -> torch.Tensor:
        return gather(out, sp, 1)

    handle.hooks.append(modules[plan.rope].register_forward_hook(split_rope))
    handle.hooks.append(
        modules[plan.first_block].register_forward_pre_hook(split_input, with_kwargs=True)
    )
    handle.hooks.append(modules[plan.output].register_forward_hook(gather_output))

    tokens: list[contextvars.Token[_Active | None]] = []

    def enter(_m: torch.nn.Module, _args: tuple[object, ...]) -> None:
        tokens.append(_CURRENT.set(state))

    def leave(_m: torch.nn.Module, _args: tuple[object, ...], _out: object) -> None:
        _CURRENT.reset(tokens.pop())

    for name, module in modules.items():
        if name and plan.self_attention(name):
            handle.hooks.append(module.register_forward_pre_hook(enter))
            handle.hooks.append(module.register_forward_hook(leave))
    return handle
