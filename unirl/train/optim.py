"""AdamW over the trainable parameters, the LR schedule, and gradient-norm clipping."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from unirl.config import require
from unirl.config.typecheck import NonNegativeFloat, PositiveFloat

LR_SCHEDULES = ("constant", "warmup_constant", "cosine")


@dataclass(kw_only=True)
class OptimizerConfig:
    """AdamW (decoupled weight decay) hyper-parameters."""

    lr: PositiveFloat = 1e-4
    """Peak learning rate (``lr_schedule`` multiplies it)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's moment decay rates (beta1, beta2), each in [0, 1)."""
    eps: PositiveFloat = 1e-8
    """AdamW's denominator epsilon."""
    weight_decay: NonNegativeFloat = 1e-4
    """Decoupled weight decay (AdamW)."""

    def __post_init__(self) -> None:
        require(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        betas = tuple(float(b) for b in self.betas)
        require(
            len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas),
            f"optimizer.betas must be two numbers in [0, 1), got {self.betas}",
        )
        self.betas = (betas[0], betas[1])
        require(self.eps > 0, f"optimizer.eps must be > 0, got {self.eps}")
        require(
            self.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {self.weight_decay}"
        )


@dataclass(kw_only=True)
class LRScheduleConfig:
    """Multiplier on ``optimizer.lr`` as a function of the number ``s`` of optimizer steps taken.

    - ``constant``: 1.
    - ``warmup_constant``: ``min(1, (s + 1) / warmup_steps)``.
    - ``cosine``: the warm-up above, then
      ``min_lr_ratio + (1 − min_lr_ratio)·½·(1 + cos(π·p))`` with
      ``p = min(1, (s − warmup_steps) / (total_steps − warmup_steps))``.
    """

    kind: str = "constant"
    """``constant``, ``warmup_constant`` or ``cosine`` (formulas: ``LRScheduleConfig``). Not
    transformers' / diffusers' ``get_scheduler``: their warm-up trains its first step at lr 0
    and their cosine rises again past its end (tests/train/test_lr_schedule_vs_libraries.py)."""
    warmup_steps: int = 0
    """Optimizer steps of the linear warm-up."""
    total_steps: int | None = None
    """Optimizer step at which the cosine reaches ``min_lr_ratio``, counted from 0 (warm-up
    included); ``cosine`` only, where it must exceed ``warmup_steps``."""
    min_lr_ratio: float = 0.0
    """The cosine's floor, as a fraction of ``optimizer.lr``."""

    def __post_init__(self) -> None:
        require(
            self.kind in LR_SCHEDULES,
            f"lr_schedule.kind must be one of {LR_SCHEDULES}, got {self.kind!r}",
        )
        require(
            self.warmup_steps >= 0,
            f"lr_schedule.warmup_steps must be >= 0, got {self.warmup_steps}",
        )
        require(
            0.0 <= self.min_lr_ratio <= 1.0,
            f"lr_schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}",
        )
        if self.kind == "constant":
            require(
                self.warmup_steps == 0,
                "lr_schedule.kind=constant takes no warmup_steps; use warmup_constant",
            )
        if self.kind == "warmup_constant":
            require(
                self.warmup_steps >= 1, "lr_schedule.kind=warmup_constant needs warmup_steps >= 1"
            )
        if self.kind == "cosine":
            require(
                self.total_steps is not None and self.total_steps > self.warmup_steps,
                f"lr_schedule.kind=cosine needs total_steps > warmup_steps ({self.warmup_steps}), "
                f"got {self.total_steps}",
            )


def lr_factor(cfg: LRScheduleConfig, step: int) -> float:
    """The multiplier after ``step`` optimizer steps (see :class:`LRScheduleConfig`)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "cosine":
        assert cfg.total_steps is not None
        progress = min(1.0, (step - cfg.warmup_steps) / (cfg.total_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (
            1.0 + math.cos(math.pi * progress)
        )
    return 1.0


def build_optimizer(
    params: Sequence[torch.nn.Parameter], cfg: OptimizerConfig
) -> torch.optim.AdamW:
    """AdamW over ``params`` (the trainable ones only)."""
    require(len(params) > 0, "the optimizer needs at least one trainable parameter")
    return torch.optim.AdamW(
        list(params), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: LRScheduleConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` with :func:`lr_factor`; its state dict carries only counters."""

    def factor(step: int) -> float:  # a closure, so the state dict stores no config object
        return lr_factor(cfg, step)

    fn: Callable[[int], float] = factor
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def grad_norm_and_clip(params: Sequence[torch.nn.Parameter], max_norm: float | None) -> Tensor:
    """Total L2 norm of the gradients over all ranks (sharded DTensor grads are reduced) as a
    0-dim fp32 tensor, after scaling them to at most ``max_norm`` (``None``: measure only).

    No host synchronisation: the clip factor ``min(1, max_norm / (norm + 1e-6))`` is applied
    on the device, and where the norm is not finite the factor is 1, so the gradients are left
    untouched and the caller can skip the step after reading the norm once.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    total = total.full_tensor() if isinstance(total, DTensor) else total
    total = total.float()
    if max_norm is not None:
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        coef = torch.where(torch.isfinite(total), coef, torch.ones_like(coef))
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        torch._foreach_mul_(local, coef.to(local[0].device))
    return total
