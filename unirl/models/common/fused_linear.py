"""Several linear layers that read the same input, computed as one matmul.

An attention block projects one input three times (q, k, v). Done as three ``[M, d] x [d, d]``
matmuls, each pass re-reads the input and the GPU's tiles are shared out three times; one
``[M, d] x [d, 3d]`` matmul reads the input once and fills the card better (see
docs/performance.md). With peft LoRA on those layers, each adapter's ``A`` (``[r, d]``, applied
to the same input) is appended to the same matmul as ``r`` extra output columns, so a LoRA
layer costs one skinny ``[M, r] x [r, d]`` matmul (its ``B``) on top of the frozen base instead
of a second pass over the input.

The math is exactly that of the separate layers (peft's ``base(x) + B(A(dropout(x))) * scaling``
for each active adapter); only the summation order inside the fused matmul differs. What may
change between calls is read on every call: peft's ``disable_adapters``, ``merged``, and the
active adapter set, so ``adapter_disabled`` / ``adapter_active`` switches behave as before.
Inside ``fp8_linear.fp8_sampling`` (no grad) the frozen weights go through one FP8 matmul and
the ``A`` columns through their own matmul in the base dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unirl.models.common.fp8_linear import fp8_applies, fp8_project


@dataclass(frozen=True)
class _Adapter:
    """One active vanilla-LoRA adapter of one layer: ``scaling · B(A(dropout(x)))``."""

    owner: int
    a: torch.Tensor  # [r, d_in]
    b: torch.Tensor  # [d_out, r]
    scaling: float
    dropout: nn.Module | None  # None when it is the identity (eval mode, p = 0)


def _lora_layer_type() -> type | None:
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # peft is optional for inference-only installs
        return None
    return LoraLinear


def _split_layer(
    index: int, layer: nn.Module, lora_type: type | None
) -> tuple[nn.Linear, list[_Adapter]]:
    """The frozen ``nn.Linear`` under ``layer`` and its active adapters (none when disabled)."""
    if isinstance(layer, nn.Linear):
        return layer, []
    if lora_type is None or not isinstance(layer, lora_type):
        raise TypeError(
            f"fused_projections takes nn.Linear or peft LoRA Linear layers, got "
            f"{type(layer).__name__}; set bundle.fuse_projections=false for this model"
        )
    base = layer.get_base_layer()
    if layer.disable_adapters or layer.merged:
        return base, []
    adapters = []
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if name in getattr(layer, "lora_variant", {}):
            raise NotImplementedError(
                f"adapter {name!r} is a peft LoRA variant (DoRA or similar), which the fused "
                "projections do not implement; set bundle.fuse_projections=false"
            )
        dropout = layer.lora_dropout[name]
        active_dropout = (
            dropout
            if isinstance(dropout, nn.Dropout) and dropout.training and dropout.p > 0
            else None
        )
        adapters.append(
            _Adapter(
                owner=index,
                a=layer.lora_A[name].weight,
                b=layer.lora_B[name].weight,
                scaling=float(layer.scaling[name]),
                dropout=active_dropout,
            )
        )
    return base, adapters


class _FrozenBaseLinear(torch.autograd.Function):
    """``x @ cat(W_1, ..., W_n, A)^T`` where the ``W_i`` are frozen and only ``A`` trains.

    Plain autograd would form the whole ``[sum n_W + n_A, d]`` weight gradient and keep its
    ``A`` rows: a full-size matmul thrown away. This backward computes the input gradient (one
    matmul against the fused weight) and ``A``'s gradient from its own output columns only.
    The fused weight is rebuilt in the backward rather than saved (a copy of a few MB).
    """

    @staticmethod
    def forward(ctx, x, a, dtype, *frozen):  # type: ignore[override]
        xc = x.to(dtype)
        ctx.save_for_backward(xc, a, *frozen)
        ctx.dtype = dtype
        ctx.x_dtype = x.dtype
        return F.linear(xc, _fused_weight(frozen, a, dtype))

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        xc, a, *frozen = ctx.saved_tensors
        dtype = ctx.dtype
        grad_out = grad_out.to(dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_out @ _fused_weight(frozen, a, dtype)).to(ctx.x_dtype)
        n_frozen = sum(w.shape[0] for w in frozen)
        grad_rows = grad_out[..., n_frozen:].reshape(-1, a.shape[0])
        grad_a = (grad_rows.t() @ xc.reshape(-1, xc.shape[-1])).to(a.dtype)
        return (grad_x, grad_a, None) + (None,) * len(frozen)


def _fused_weight(
    frozen: Sequence[torch.Tensor], a: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    parts = [w.to(dtype) for w in frozen] + ([] if a is None else [a.to(dtype)])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def fused_projections(x: torch.Tensor, layers: Sequence[nn.Module]) -> list[torch.Tensor]:
    """``[layer(x) for layer in layers]`` computed with one matmul over the concatenated weights.

    Each layer is an ``nn.Linear`` or a peft LoRA ``Linear`` wrapping one; ``x[..., d_in]``.
    Adapters whose dropout is active, or whose dtype differs from the base's outside autocast
    (peft then runs them in their own dtype), are computed beside the fused matmul, as peft
    would; every other active adapter's ``A`` rides in the fused matmul. Biases are added to
    each output after the matmul, where the compiler fuses them into the next elementwise
    kernel (a bias epilogue over the fused output cost a separate full-size pass on an H100).
    """
    lora_type = _lora_layer_type()
    bases: list[nn.Linear] = []
    adapters: list[_Adapter] = []
    for i, layer in enumerate(layers):
        base, found = _split_layer(i, layer, lora_type)
        bases.append(base)
        adapters.extend(found)
    base_dtype = bases[0].weight.dtype
    autocast = torch.is_autocast_enabled(x.device.type)
    dtype = torch.get_autocast_dtype(x.device.type) if autocast else base_dtype
    folded: list[_Adapter] = []
    beside: list[_Adapter] = []
    for ad in adapters:
        foldable = ad.dropout is None and (autocast or ad.a.dtype == base_dtype)
        (folded if foldable else beside).append(ad)

    frozen = [base.weight for base in bases]
    a = None
    if folded:
        a = torch.cat([ad.a for ad in folded]) if len(folded) > 1 else folded[0].a
    base_frozen = not any(w.requires_grad for w in frozen) and not any(
        base.bias is not None and base.bias.requires_grad for base in bases
    )
    fp8 = fp8_applies(x, bases)
    if fp8:  # FP8 sampling (fp8_linear.py): the frozen bases in FP8, A beside
        fused = fp8_project(x, bases, dtype)
        lora_cols = None if a is None else F.linear(x.to(dtype), a.to(dtype))
    elif a is not None and torch.is_grad_enabled() and a.requires_grad and base_frozen:
        fused = _FrozenBaseLinear.apply(x, a, dtype, *frozen)
    else:
        fused = F.linear(x.to(dtype), _fused_weight(frozen, a, dtype))

    widths = [base.out_features for base in bases]
    n_base = sum(widths)
    if not fp8:
        lora_cols = fused[..., n_base:]
    outs = list(torch.split(fused[..., :n_base], widths, dim=-1))
    for i, base in enumerate(bases):
        if base.bias is not None:
            outs[i] = outs[i] + base.bias.to(outs[i].dtype)
    start = 0
    for ad in folded:
        rank = ad.a.shape[0]
        # a copy of the r columns, so the B matmul's saved input does not keep the whole
        # fused output alive until the backward
        assert lora_cols is not None
        hidden = lora_cols[..., start : start + rank].contiguous()
        start += rank
        outs[ad.owner] = outs[ad.owner] + F.linear(hidden, ad.b.to(hidden.dtype)) * ad.scaling
    for ad in beside:
        xa = x.to(ad.a.dtype)
        if ad.dropout is not None:
            xa = ad.dropout(xa)
        lora = F.linear(F.linear(xa, ad.a), ad.b) * ad.scaling
        outs[ad.owner] = (outs[ad.owner] + lora).to(outs[ad.owner].dtype)
    return outs
