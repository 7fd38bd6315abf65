"""The elementwise pieces of a decode step, written once as plain torch functions with the
formulas of transformers' Qwen modules (RMS norm in fp32 then cast back, rotate-half rotary,
SwiGLU), and optionally compiled: on CUDA ``torch.compile`` fuses each into one kernel, which
matters because a decode step is hundreds of tiny kernels (see README.md, "Decode engine")."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
import torch.nn.functional as F

P = ParamSpec("P")
R = TypeVar("R")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` with the statistics in fp32 and the product in x's dtype."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm(
    residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + delta, rms_norm(residual + delta))``: the residual stream and its norm."""
    residual = residual + delta
    return residual, rms_norm(residual, weight, eps)


def norm_rope(
    x: torch.Tensor,
    norm: tuple[torch.Tensor, float] | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """Per-head RMS norm (Qwen3's q/k norm, when given), then the rotate-half rotary."""
    if norm is not None:
        x = rms_norm(x, norm[0], norm[1])
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


class Kernels:
    """The pieces above, eager or each through ``torch.compile`` (``compiled``)."""

    def __init__(self, *, compiled: bool) -> None:
        self.compiled = compiled

        def wrap(fn: Callable[P, R]) -> Callable[P, R]:
            return torch.compile(fn, dynamic=False, fullgraph=True) if compiled else fn

        self.rms_norm = wrap(rms_norm)
        self.add_rms_norm = wrap(add_rms_norm)
        self.norm_rope = wrap(norm_rope)
        self.swiglu = wrap(swiglu)
