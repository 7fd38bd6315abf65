"""FP8 matmuls for the *frozen* linear layers of a model (a LoRA run's base weights).

A frozen ``nn.Linear`` with weight ``W[out, in]`` is switched in place to :class:`Fp8Linear`
(same parameters, same state-dict keys). Its weight is quantised once to float8 e4m3 with one
scale per output row, ``W ≈ Wq · s_w``, and a second copy of ``Wᵀ`` with one scale per input
column serves the backward. Every call quantises its input per row (``x ≈ xq · s_x``,
``s = amax / 448``) and runs ``torch._scaled_mm``, which accumulates in fp32 and applies both
scales in the epilogue:

    y = (xq @ Wqᵀ) · s_x · s_wᵀ + b                                      forward
    ∂L/∂x = (gq @ Wtq) · s_g · s_wtᵀ,   g = ∂L/∂y quantised per row          backward

With ``rowwise=False`` every operand has a single scale instead (one per tensor), which
selects cuBLAS's tensorwise FP8 kernels. No gradient flows to ``W`` or ``b`` (they are
frozen); a LoRA branch on top stays in the autocast dtype and receives exact gradients of its
own. The price is e4m3 rounding of both operands (3 mantissa bits: about 4% relative error
per matmul on random data with rowwise scales, see ``tests/train/test_fp8.py``); whether it
is faster than bf16 depends on the card, the shapes and the kernels (measured in
``docs/performance.md``).

Rollout and training run the same function, so the policy that samples is the policy that
trains. The quantised copies are buffers computed from the weight at conversion time; a
frozen weight that is later overwritten in place needs :func:`refresh_fp8` (the backend
refuses FP8 for a trainable base).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_MIN_AMAX = 1e-12


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q[M, K] e4m3, scale[M, 1] fp32)`` with ``x ≈ q · scale`` row by row (``x`` 2-D)."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True).clamp_min(_MIN_AMAX)
    scale = amax / E4M3_MAX
    return (xf / scale).to(E4M3), scale


def quantize_tensorwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q e4m3, scale[] fp32)`` with ``x ≈ q · scale`` and one scale for the whole tensor."""
    xf = x.float()
    scale = xf.abs().amax().clamp_min(_MIN_AMAX) / E4M3_MAX
    return (xf / scale).to(E4M3), scale


def quantize(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rowwise(x) if rowwise else quantize_tensorwise(x)


class _Fp8Matmul(torch.autograd.Function):
    """``x2d @ Wᵀ`` with FP8 operands; the gradient goes to ``x2d`` only."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        x2d: torch.Tensor,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        wt_q: torch.Tensor,
        wt_scale: torch.Tensor,
        out_dtype: torch.dtype,
        rowwise: bool,
    ) -> torch.Tensor:
        xq, xs = quantize(x2d, rowwise)
        y = torch._scaled_mm(xq, w_q.t(), scale_a=xs, scale_b=w_scale, out_dtype=out_dtype)
        ctx.save_for_backward(wt_q, wt_scale)
        ctx.grad_dtype = x2d.dtype  # type: ignore[attr-defined]
        ctx.rowwise = rowwise  # type: ignore[attr-defined]
        return y

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        wt_q, wt_scale = ctx.saved_tensors  # type: ignore[attr-defined]
        gq, gs = quantize(grad_out, ctx.rowwise)  # type: ignore[attr-defined]
        grad_in = torch._scaled_mm(
            gq,
            wt_q.t(),
            scale_a=gs,
            scale_b=wt_scale,
            out_dtype=ctx.grad_dtype,  # type: ignore[attr-defined]
        )
        return grad_in, None, None, None, None, None, None


class Fp8Linear(nn.Linear):
    """A frozen ``nn.Linear`` whose matmul runs in FP8 (see the module docstring).

    Made by :func:`convert_frozen_linears` (``__class__`` switch: parameters, names and
    ``isinstance(m, nn.Linear)`` are unchanged, so peft's LoRA wrappers call it as their base
    layer). The quantised weights are non-persistent buffers: checkpoints and exports never
    see them.
    """

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor
    weight_t_fp8: torch.Tensor
    weight_t_scale: torch.Tensor
    fp8_rowwise: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = (
            torch.get_autocast_dtype(x.device.type)
            if torch.is_autocast_enabled(x.device.type)
            else x.dtype
        )
        x2d = x.reshape(-1, x.shape[-1])
        y = _Fp8Matmul.apply(
            x2d,
            self.weight_fp8,
            self.weight_scale,
            self.weight_t_fp8,
            self.weight_t_scale,
            out_dtype,
            self.fp8_rowwise,
        )
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        scales = "rowwise" if self.fp8_rowwise else "tensorwise"
        return super().extra_repr() + f", fp8=e4m3 {scales}"


@torch.no_grad()
def refresh_fp8(module: Fp8Linear) -> None:
    """(Re)compute the quantised copies from ``module.weight`` (full, unsharded)."""
    w = module.weight.detach()
    w = w.full_tensor() if hasattr(w, "full_tensor") else w
    if module.fp8_rowwise:
        w_q, w_scale = quantize_rowwise(w)  # rows = output features
        wt_q, wt_scale = quantize_rowwise(w.t())  # rows = input features
        w_scale, wt_scale = w_scale.reshape(1, -1), wt_scale.reshape(1, -1)
    else:
        w_q, w_scale = quantize_tensorwise(w)
        wt_q, wt_scale = w_q.t(), w_scale
    for name, value in (
        ("weight_fp8", w_q),
        ("weight_scale", w_scale.contiguous()),
        ("weight_t_fp8", wt_q.contiguous()),
        ("weight_t_scale", wt_scale.contiguous()),
    ):
        module.register_buffer(name, value, persistent=False)


def fp8_eligible(module: nn.Module) -> str | None:
    """Why ``module`` cannot run in FP8 (``None`` when it can)."""
    if type(module) is not nn.Linear:
        return f"{type(module).__name__} is not a plain nn.Linear"
    if module.weight.requires_grad or (module.bias is not None and module.bias.requires_grad):
        return "its weight trains (FP8 copies would go stale)"
    if module.in_features % 16 or module.out_features % 16:
        return f"{module.in_features}x{module.out_features} is not a multiple of 16"
    return None


def fp8_device_problem(device: torch.device) -> str | None:
    """Why ``device`` cannot run FP8 matmuls (``None`` when it can: CPU, or CUDA sm89+)."""
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            return f"{torch.cuda.get_device_name(device)} (sm{major}{minor}) has no FP8 matmuls; sm89+ needed"
        return None
    return f"device type {device.type!r} has no FP8 matmul support here"


def convert_frozen_linears(
    roots: Iterable[nn.Module], *, exclude: tuple[str, ...] = ("norm",), rowwise: bool = True
) -> list[str]:
    """Switch every eligible frozen ``nn.Linear`` under ``roots`` to :class:`Fp8Linear`.

    Linears whose qualified name (relative to its root) contains one of ``exclude`` stay as
    they are (default: the adaLN modulation linears, tiny matmuls that set every scale and
    shift). ``rowwise``: one scale per row of each operand (default), else one per tensor
    (cuBLAS's fastest FP8 path, coarser). Returns the converted names
    (``<root index>.<name>``).
    """
    converted = []
    for index, root in enumerate(roots):
        for name, module in root.named_modules():
            if any(token in name for token in exclude) or fp8_eligible(module) is not None:
                continue
            module.__class__ = Fp8Linear
            module.fp8_rowwise = rowwise
            refresh_fp8(module)  # type: ignore[arg-type]
            converted.append(f"{index}.{name}")
    return converted
