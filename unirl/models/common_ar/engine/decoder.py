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

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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
    """``x @ (W + Σ s·B·A)ᵀ + b`` with the merged weight held in its own buffer (the base
    weight is never touched, so "unmerging" is exact by construction). ``refresh()`` recomputes
    the buffer in place (fp32 sum, cast once) when the adapters' checksum changed."""

    def __init__(self, module: nn.Module) -> None:
        self.base, self.parts = _lora_parts(module)
        weight = self.base.weight
        self.bias = self.base.bias
        self.weight = torch.empty_like(weight)
        self.checksum: str | None = None

    def adapters_checksum(self) -> str:
        digest = hashlib.sha256()
        for a, b, s in self.parts:
            for t in (a.weight, b.weight):
                digest.update(t.detach().float().cpu().numpy().tobytes())
            digest.update(repr(s).encode())
        digest.update(str(self.base.weight.data_ptr()).encode())
        return digest.hexdigest()

    @torch.no_grad()
    def refresh(self) -> bool:
        """Recompute the merged weight when the adapters changed; True when it did."""
        checksum = self.adapters_checksum()
        if checksum == self.checksum:
            return False
        merged = self.base.weight.detach().float()
        for a, b, s in self.parts:
            merged = merged + s * (b.weight.detach().float() @ a.weight.detach().float())
        self.weight.copy_(merged.to(self.weight.dtype))
        self.checksum = checksum
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)


@dataclass
class LayerView:
    """One decoder layer's callables (norms are the model's modules)."""

    input_norm: nn.Module
    q: Projection
    k: Projection
    v: Projection
    o: Projection
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    post_norm: nn.Module
    gate: Projection
    up: Projection
    down: Projection
    act: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class DecoderView:
    """A Qwen-style decoder read from a transformers causal LM (see the module docstring)."""

    embed: nn.Module
    layers: list[LayerView]
    norm: nn.Module
    lm_head: nn.Module
    rotary: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    merged: list[MergedLinear] = field(default_factory=list)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def refresh_merged(self) -> int:
        """Re-merge every LoRA projection whose adapters changed; returns how many did."""
        return sum(m.refresh() for m in self.merged)

    def weight_pointers(self) -> tuple[int, ...]:
        """Storage of every tensor a captured step reads (a change invalidates the graphs)."""
        module_ptrs = []
        for mod in (self.embed, self.norm, self.lm_head):
            module_ptrs.extend(p.data_ptr() for p in mod.parameters())
        for layer in self.layers:
            for part in vars(layer).values():
                if isinstance(part, nn.Module):
                    module_ptrs.extend(p.data_ptr() for p in part.parameters())
                elif isinstance(part, MergedLinear):
                    module_ptrs.append(part.weight.data_ptr())
        return tuple(module_ptrs)


def decoder_view(model: nn.Module, *, lora: str = "fused") -> DecoderView:
    """Read a :class:`DecoderView` from ``model`` (see :func:`causal_lm_of`); ``lora``:
    ``fused`` calls peft's layers, ``merged`` replaces each LoRA projection by a
    :class:`MergedLinear`. Raises ``ValueError`` naming what does not fit (a sharded weight,
    a decoder without the Qwen layout, sliding-window layers)."""
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

    def proj(module: nn.Module) -> Projection:
        if lora == "merged" and _lora_parts(module)[1]:
            m = MergedLinear(module)
            merged.append(m)
            return m
        return module

    layers = []
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(
            LayerView(
                input_norm=layer.input_layernorm,
                q=proj(attn.q_proj),
                k=proj(attn.k_proj),
                v=proj(attn.v_proj),
                o=proj(attn.o_proj),
                q_norm=getattr(attn, "q_norm", None),
                k_norm=getattr(attn, "k_norm", None),
                post_norm=layer.post_attention_layernorm,
                gate=proj(mlp.gate_proj),
                up=proj(mlp.up_proj),
                down=proj(mlp.down_proj),
                act=mlp.act_fn,
            )
        )
    first = decoder.layers[0].self_attn
    head_dim = int(first.head_dim)
    num_heads = int(config.num_attention_heads)
    num_kv_heads = int(config.num_key_value_heads)
    return DecoderView(
        embed=decoder.embed_tokens,
        layers=layers,
        norm=decoder.norm,
        lm_head=lm_head,
        rotary=decoder.rotary_emb,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scaling=float(first.scaling),
        merged=merged,
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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
    cos, sin = view.rotary(hidden, state.rope_pos[:b][:, None])  # [b, 1, head_dim]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [b, 1, 1, head_dim] over heads
    group = view.num_heads // view.num_kv_heads
    for i, layer in enumerate(view.layers):
        x = layer.input_norm(hidden)
        q = layer.q(x).view(b, 1, view.num_heads, view.head_dim)
        k = layer.k(x).view(b, 1, view.num_kv_heads, view.head_dim)
        v = layer.v(x).view(b, 1, view.num_kv_heads, view.head_dim)
        if layer.q_norm is not None:
            q = layer.q_norm(q)
        if layer.k_norm is not None:
            k = layer.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_cache, v_cache = state.k_cache[i], state.v_cache[i]
        k_cache[slot, :, write] = k[:, 0].to(k_cache.dtype)
        v_cache[slot, :, write] = v[:, 0].to(v_cache.dtype)
        # query heads h = kv * group + g share kv head kv: the group is the query length
        qg = q[:, 0].reshape(b, view.num_kv_heads, group, view.head_dim).to(k_cache.dtype)
        attn = F.scaled_dot_product_attention(
            qg, k_cache[:b], v_cache[:b], attn_mask=mask, scale=view.scaling
        )
        hidden = hidden + layer.o(attn.reshape(b, 1, view.num_heads * view.head_dim))
        x = layer.post_norm(hidden)
        hidden = hidden + layer.down(layer.act(layer.gate(x)) * layer.up(x))
    logits = view.lm_head(view.norm(hidden))[:, 0].float()
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
