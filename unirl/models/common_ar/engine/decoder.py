"""The decoder's pieces, read from a transformers causal LM, and one decode step over slots.

``DecoderView`` holds references to the modules of a Qwen-style decoder (embedding, layers
with RMS norms, q/k/v/o and SwiGLU projections, optional per-head q/k norms, final norm,
LM head, rotary table): the trainer's own modules, so the engine samples the weights the
trainer holds. A LoRA-wrapped projection (peft) is either called as it is (``fused``: base
plus ``B(A(x))·s``, the trainer's function) or replaced by a merged copy
``W + s·B·A`` (``merged``: one matmul), refreshed when the adapter's checksum changes.

``decode_step`` is the math of one token for every slot: the slot's last token in, its K/V
written at ``cache_pos`` of the static cache, attention over the slot's cache row (keys
past ``cache_pos`` masked), the next token drawn from the slot's own uniform and its fp32
log-prob recorded — every op on the device, no host sync, so a CUDA graph can replay it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from unirl.models.common_ar.engine.kernels import Kernels
from unirl.models.common_ar.generate import draw_tokens, policy_log_probs

Projection = Callable[[torch.Tensor], torch.Tensor]


def causal_lm_of(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside the trainer's module: peft's wrapper and a
    family's own wrapper (``causal_lm`` attribute, e.g. the unified model's ``lm``) removed."""
    inner: Any = model
    for _ in range(4):
        if hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
            continue
        wrapped = getattr(type(inner), "causal_lm_attr", None)
        if wrapped:
            inner = getattr(inner, wrapped)
            continue
        break
    return inner


def _lora_parts(module: nn.Module) -> tuple[nn.Module, list[tuple[nn.Module, nn.Module, float]]]:
    """``(base_linear, [(A, B, scaling)])`` of a peft LoRA layer's active adapters, or
    ``(module, [])`` for a plain linear."""
    base = getattr(module, "base_layer", None)
    if base is None or not hasattr(module, "lora_A"):
        return module, []
    if getattr(module, "merged", False):
        raise ValueError(
            "the decode engine found a peft LoRA layer whose adapter is merged into its base "
            "weights; unmerge it (the trainer keeps adapters separate)"
        )
    if getattr(module, "disable_adapters", False):
        return base, []
    parts = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if getattr(module, "use_dora", {}).get(name, False):
            raise ValueError(
                "pipeline.engine.lora=merged does not support DoRA adapters; use lora=fused"
            )
        parts.append((module.lora_A[name], module.lora_B[name], float(module.scaling[name])))
    return base, parts


class MergedLinear:
    """One matmul for one or more projections of the same input (q/k/v, gate/up):
    ``x @ [W₁ + Σ s·B·A; W₂ + …]ᵀ + b``, the merged weights held in the engine's own buffer
    (the trainer's weights are never touched, so "unmerging" is exact by construction).
    ``outputs``: each projection's output width, to split the result."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.modules = list(modules)
        self.bases = [_lora_parts(m)[0] for m in modules]
        self.outputs = [int(b.weight.shape[0]) for b in self.bases]
        first = self.bases[0].weight
        self.weight = torch.empty(
            (sum(self.outputs), first.shape[1]), dtype=first.dtype, device=first.device
        )
        self.bias: torch.Tensor | None = None
        if any(b.bias is not None for b in self.bases):
            self.bias = first.new_zeros(sum(self.outputs))
        self.checksum: tuple[Any, ...] | None = None

    @property
    def parts(self) -> list[list[tuple[nn.Module, nn.Module, float]]]:
        """Each projection's active adapters now (none while peft's adapters are disabled:
        the merged copy then holds the base, as the trainer's forward computes it)."""
        return [_lora_parts(m)[1] for m in self.modules]

    def adapter_state(self) -> tuple[Any, ...]:
        """Which adapters are active, per projection (part of the re-merge checksum)."""
        return tuple(
            (bool(getattr(m, "disable_adapters", False)), tuple(getattr(m, "active_adapters", ())))
            for m in self.modules
        )

    def followed(self) -> list[torch.Tensor]:
        """The tensors the merged weight follows: every base weight and bias and adapter
        matrix (a full fine-tune trains the biases too)."""
        out = []
        for base, parts in zip(self.bases, self.parts, strict=True):
            out.append(base.weight)
            if base.bias is not None:
                out.append(base.bias)
            for a, b, _ in parts:
                out.extend((a.weight, b.weight))
        return out

    @torch.no_grad()
    def merge(self) -> None:
        """Recompute the merged weight (fp32 sum, cast once) and copy the biases."""
        row = 0
        for base, parts, n in zip(self.bases, self.parts, self.outputs, strict=True):
            merged = base.weight.detach().float()
            for a, b, s in parts:
                merged = merged + s * (b.weight.detach().float() @ a.weight.detach().float())
            self.weight[row : row + n].copy_(merged.to(self.weight.dtype))
            if self.bias is not None:
                if base.bias is None:
                    self.bias[row : row + n].zero_()
                else:
                    self.bias[row : row + n].copy_(base.bias.detach())
            row += n

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)


class _Split:
    """Several projections of one input run as the model's own modules (fused LoRA)."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.modules = list(modules)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [m(x) for m in self.modules]


class _Merged:
    """A :class:`MergedLinear` of several projections, its output split back."""

    def __init__(self, merged: MergedLinear) -> None:
        self.merged = merged

    def __call__(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        return self.merged(x).split(self.merged.outputs, dim=-1)


Norm = tuple[torch.Tensor, float]
Group = Callable[[torch.Tensor], Sequence[torch.Tensor]]


@dataclass
class LayerView:
    """One decoder layer: its norms' ``(weight, eps)``, its projections (``qkv`` and
    ``gate_up`` return the split outputs, merged into one matmul or run as the model's
    modules)."""

    input_norm: Norm
    qkv: Group
    o: Projection
    q_norm: Norm | None
    k_norm: Norm | None
    post_norm: Norm
    gate_up: Group
    down: Projection
    act: Callable[[torch.Tensor], torch.Tensor] | None  # None: SiLU (fused with the product)


@dataclass
class DecoderView:
    """A Qwen-style decoder read from a transformers causal LM (see the module docstring)."""

    embed: nn.Module
    layers: list[LayerView]
    norm: Norm
    lm_head: nn.Module
    rotary: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    position_axes: int  # 3 for multimodal rotary positions (Qwen-VL), else 1
    kernels: Kernels
    merged: list[MergedLinear] = field(default_factory=list)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @torch.no_grad()
    def refresh_merged(self) -> int:
        """Re-merge every merged projection whose weights changed; returns how many did.

        The checksum of each followed tensor (base weight, adapter matrices) is its fp32
        norm and sum, computed on the device and read back once, with its storage and its
        in-place version counter, plus which adapters are active: an optimizer step, a loaded
        checkpoint or ``adapter_disabled()`` changes it."""
        if not self.merged:
            return 0
        followed = [m.followed() for m in self.merged]
        flat = [t.detach().float() for ts in followed for t in ts]
        sums = torch.stack([t.sum() for t in flat])
        norms = torch.stack(torch._foreach_norm(flat))
        values = torch.stack([norms, sums], dim=1).tolist()
        changed, at = 0, 0
        for m, ts in zip(self.merged, followed, strict=True):
            key = (
                m.adapter_state(),
                *((*values[at + j], t.data_ptr(), t._version) for j, t in enumerate(ts)),
            )
            at += len(ts)
            if key != m.checksum:
                m.merge()
                m.checksum = key
                changed += 1
        return changed

    def weight_pointers(self) -> tuple[int, ...]:
        """Storage of every tensor a captured step reads (a change invalidates the graphs)."""
        ptrs = [p.data_ptr() for mod in (self.embed, self.lm_head) for p in mod.parameters()]
        ptrs.append(self.norm[0].data_ptr())
        for layer in self.layers:
            for part in vars(layer).values():
                if isinstance(part, nn.Module):
                    ptrs.extend(p.data_ptr() for p in part.parameters())
                elif isinstance(part, MergedLinear):
                    ptrs.append(part.weight.data_ptr())
                elif isinstance(part, _Merged):
                    ptrs.append(part.merged.weight.data_ptr())
                elif isinstance(part, _Split):
                    ptrs.extend(p.data_ptr() for m in part.modules for p in m.parameters())
                elif isinstance(part, tuple):
                    ptrs.append(part[0].data_ptr())
        return tuple(ptrs)


def _norm(module: nn.Module) -> Norm:
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None)
    if eps is None or not hasattr(module, "weight"):
        raise ValueError(
            f"the decode engine expects RMS norms with weight and variance_epsilon, found "
            f"{type(module).__name__}; set pipeline.sampler=loop for this model"
        )
    return module.weight, float(eps)


def decoder_view(model: nn.Module, *, lora: str = "fused", compiled: bool = False) -> DecoderView:
    """Read a :class:`DecoderView` from ``model`` (see :func:`causal_lm_of`). ``lora``:
    ``fused`` calls the model's (peft) projections; ``merged`` runs q/k/v and gate/up as one
    matmul each over merged copies (:class:`MergedLinear`; o and down too when LoRA-wrapped).
    ``compiled``: the elementwise pieces (norms, rotary, SwiGLU) through ``torch.compile``.
    Raises ``ValueError`` naming what does not fit (a sharded weight, a decoder without the
    Qwen layout, sliding-window layers)."""
    lm = causal_lm_of(model)
    for p in lm.parameters():
        if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor":
            raise ValueError(
                "the decode engine needs the whole model on this rank, but its weights are "
                "sharded (FSDP2); use backend.fsdp.data_parallel=replicate or pipeline.sampler=loop"
            )
        break
    get_decoder = getattr(lm, "get_decoder", None)
    decoder: Any = get_decoder() if callable(get_decoder) else None
    lm_head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if decoder is None or lm_head is None or not hasattr(decoder, "layers"):
        raise ValueError(
            f"the decode engine cannot read {type(lm).__name__}: it needs get_decoder() with "
            "layers and get_output_embeddings(); set pipeline.sampler=loop for this model"
        )
    config = decoder.config
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        raise ValueError(
            f"{type(lm).__name__} has sliding-window layers, which the decode engine does not "
            "implement; set pipeline.sampler=loop"
        )
    merged: list[MergedLinear] = []

    def group(modules: Sequence[nn.Module]) -> Group:
        if lora != "merged":
            return _Split(modules)
        m = MergedLinear(modules)
        merged.append(m)
        return _Merged(m)

    def single(module: nn.Module) -> Projection:
        if lora == "merged" and _lora_parts(module)[1]:
            m = MergedLinear([module])
            merged.append(m)
            return m
        return module

    silu = getattr(config, "hidden_act", None) == "silu"
    layers = []
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        layers.append(
            LayerView(
                input_norm=_norm(layer.input_layernorm),
                qkv=group([attn.q_proj, attn.k_proj, attn.v_proj]),
                o=single(attn.o_proj),
                q_norm=_norm(q_norm) if q_norm is not None else None,
                k_norm=_norm(k_norm) if k_norm is not None else None,
                post_norm=_norm(layer.post_attention_layernorm),
                gate_up=group([mlp.gate_proj, mlp.up_proj]),
                down=single(mlp.down_proj),
                act=None if silu else mlp.act_fn,
            )
        )
    first = decoder.layers[0].self_attn
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return DecoderView(
        embed=decoder.embed_tokens,
        layers=layers,
        norm=_norm(decoder.norm),
        lm_head=lm_head,
        rotary=decoder.rotary_emb,
        num_heads=int(config.num_attention_heads),
        num_kv_heads=int(config.num_key_value_heads),
        head_dim=int(first.head_dim),
        scaling=float(first.scaling),
        position_axes=3 if "mrope_section" in dict(rope or {}) else 1,
        kernels=Kernels(compiled=compiled),
        merged=merged,
    )


@dataclass
class SamplingSpec:
    """What a captured step bakes in: the policy's temperature, the truncation, the stop
    tokens and the tokens never emitted."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    suppress_token_ids: tuple[int, ...]


@dataclass
class SlotState:
    """Static device buffers of every slot (``S`` slots, cache length ``L``): what the decode
    step reads and updates in place."""

    k_cache: list[torch.Tensor]  # per layer [S, kv_heads, L, head_dim]
    v_cache: list[torch.Tensor]
    last_token: torch.Tensor  # [S] long: the token whose K/V the next step writes
    cache_pos: torch.Tensor  # [S] long: where that K/V goes (= tokens already cached)
    rope_pos: torch.Tensor  # [S] long: its rotary position
    step: torch.Tensor  # [S] long: tokens generated so far (the next token's index)
    active: torch.Tensor  # [S] bool: still generating
    uniforms: torch.Tensor  # [S, max_new] fp64: each slot's sample's own stream
    out_tokens: torch.Tensor  # [S, max_new] long
    out_log_probs: torch.Tensor  # [S, max_new] fp32
    stops: torch.Tensor  # [n_stop] long
    suppress: torch.Tensor  # [n_suppress] long

    # the per-slot buffers (moved with a slot, saved around a graph capture)
    BOOKKEEPING: ClassVar[tuple[str, ...]] = (
        "last_token",
        "cache_pos",
        "rope_pos",
        "step",
        "active",
        "uniforms",
        "out_tokens",
        "out_log_probs",
    )

    @property
    def num_slots(self) -> int:
        return int(self.last_token.shape[0])

    @property
    def cache_len(self) -> int:
        return int(self.k_cache[0].shape[2])


def allocate_slots(
    view: DecoderView, *, num_slots: int, cache_len: int, spec: SamplingSpec
) -> SlotState:
    """The KV cache and slot buffers, allocated once for a generate call."""
    device, dtype = view.device, view.dtype
    shape = (num_slots, view.num_kv_heads, cache_len, view.head_dim)
    n = len(view.layers)

    def zeros(*size: int, dt: torch.dtype = torch.long) -> torch.Tensor:
        return torch.zeros(size, dtype=dt, device=device)

    return SlotState(
        k_cache=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
        v_cache=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
        last_token=zeros(num_slots),
        cache_pos=zeros(num_slots),
        rope_pos=zeros(num_slots),
        step=zeros(num_slots),
        active=zeros(num_slots, dt=torch.bool),
        uniforms=zeros(num_slots, spec.max_new_tokens, dt=torch.float64),
        out_tokens=zeros(num_slots, spec.max_new_tokens),
        out_log_probs=zeros(num_slots, spec.max_new_tokens, dt=torch.float32),
        stops=torch.tensor(sorted(set(spec.stop_token_ids)), dtype=torch.long, device=device),
        suppress=torch.tensor(
            sorted(set(spec.suppress_token_ids)), dtype=torch.long, device=device
        ),
    )


def sample_and_record(
    logits: torch.Tensor, state: SlotState, spec: SamplingSpec, slots: torch.Tensor
) -> None:
    """Draw the next token of ``slots[b]`` (long indices) from ``logits[b, V]`` (fp32) with
    each slot's uniform at its step, record token and fp32 log-prob where the slot is active,
    and mark the slots that finish (a stop token, or ``max_new_tokens`` reached). Device ops
    only."""
    if state.suppress.numel():
        logits = logits.index_fill(-1, state.suppress, float("-inf"))
    step = state.step[slots]
    index = step.clamp_max(spec.max_new_tokens - 1)
    u = state.uniforms[slots, index]
    token = draw_tokens(logits, u, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k)
    logp = policy_log_probs(logits, spec.temperature).gather(1, token[:, None])[:, 0]
    active = state.active[slots]
    state.out_tokens[slots, index] = torch.where(active, token, state.out_tokens[slots, index])
    state.out_log_probs[slots, index] = torch.where(active, logp, state.out_log_probs[slots, index])
    if state.stops.numel():  # a comparison, not torch.isin (no host sync in a graph)
        stopped = (token[:, None] == state.stops[None, :]).any(-1)
    else:
        stopped = torch.zeros_like(active)
    finished = active & (stopped | (step + 1 >= spec.max_new_tokens))
    state.step[slots] = step + active.long()
    state.active[slots] = active & ~finished
    state.last_token[slots] = token


def decode_step(view: DecoderView, state: SlotState, spec: SamplingSpec, b: int) -> None:
    """One token for slots ``0 .. b-1`` (every one computes; an inactive slot records nothing
    and only touches its own cache row). See the module docstring."""
    cache_len = state.cache_len
    cache_pos = state.cache_pos[:b]
    write = cache_pos.clamp_max(cache_len - 1)
    slot = torch.arange(b, device=cache_pos.device)
    visible = torch.arange(cache_len, device=cache_pos.device)[None, :] <= write[:, None]
    mask = visible[:, None, None, :]  # [b, 1, 1, L]: broadcast over kv heads and the group
    hidden = view.embed(state.last_token[:b])[:, None, :]  # [b, 1, D]
    positions = state.rope_pos[:b][:, None]
    if view.position_axes == 3:  # text positions advance every multimodal axis alike
        positions = positions[None].expand(3, -1, -1)
    cos, sin = view.rotary(hidden, positions)  # [b, 1, head_dim]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [b, 1, 1, head_dim] over heads
    group = view.num_heads // view.num_kv_heads
    ops = view.kernels
    x = ops.rms_norm(hidden, *view.layers[0].input_norm)
    for i, layer in enumerate(view.layers):
        q, k, v = layer.qkv(x)
        q = ops.norm_rope(q.view(b, 1, view.num_heads, view.head_dim), layer.q_norm, cos, sin)
        k = ops.norm_rope(k.view(b, 1, view.num_kv_heads, view.head_dim), layer.k_norm, cos, sin)
        v = v.view(b, 1, view.num_kv_heads, view.head_dim)
        k_cache, v_cache = state.k_cache[i], state.v_cache[i]
        k_cache[slot, :, write] = k[:, 0].to(k_cache.dtype)
        v_cache[slot, :, write] = v[:, 0].to(v_cache.dtype)
        # query heads h = kv * group + g share kv head kv: the group is the query length
        qg = q[:, 0].reshape(b, view.num_kv_heads, group, view.head_dim).to(k_cache.dtype)
        attn = F.scaled_dot_product_attention(
            qg, k_cache[:b], v_cache[:b], attn_mask=mask, scale=view.scaling
        )
        out = layer.o(attn.reshape(b, 1, view.num_heads * view.head_dim))
        hidden, x = ops.add_rms_norm(hidden, out, *layer.post_norm)
        gate, up = layer.gate_up(x)
        mlp = layer.down(ops.swiglu(gate, up) if layer.act is None else layer.act(gate) * up)
        after = view.layers[i + 1].input_norm if i + 1 < len(view.layers) else view.norm
        hidden, x = ops.add_rms_norm(hidden, mlp, *after)
    logits = view.lm_head(x)[:, 0].float()
    sample_and_record(logits, state, spec, slot)
    state.cache_pos[:b] = (cache_pos + 1).clamp_max(cache_len - 1)
    state.rope_pos[:b] = state.rope_pos[:b] + 1


def install_prefix(
    state: SlotState,
    slots: Sequence[int],
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
) -> None:
    """Copy one prompt's cached K/V (per layer ``[kv_heads, P, head_dim]``) into ``slots``."""
    index = torch.as_tensor(list(slots), dtype=torch.long, device=state.last_token.device)
    length = int(keys[0].shape[1])
    for i in range(len(keys)):
        state.k_cache[i][index, :, :length] = keys[i].to(state.k_cache[i].dtype)
        state.v_cache[i][index, :, :length] = values[i].to(state.v_cache[i].dtype)
