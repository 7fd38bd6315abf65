"""Exponential moving average of the trainable parameters (fp32, shard-local under FSDP)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from unirl.config import require
from unirl.train.parallel import local_tensor


@dataclass(kw_only=True)
class EMAConfig:
    """After optimizer step ``s`` (1-based): while ``s < start_step`` the average tracks the
    parameters exactly (``ema ← θ``); from ``start_step`` on, every ``update_interval`` steps
    (``(s − start_step) % update_interval == 0``), ``ema ← decay·ema + (1 − decay)·θ``."""

    decay: float = 0.9
    """The average's decay per update, in [0, 1): ``ema ← decay·ema + (1 − decay)·θ``."""
    update_interval: int = 1
    start_step: int = 0

    def __post_init__(self) -> None:
        require(0.0 <= self.decay < 1.0, f"ema.decay must be in [0, 1), got {self.decay}")
        require(
            self.update_interval >= 1,
            f"ema.update_interval must be >= 1, got {self.update_interval}",
        )
        require(self.start_step >= 0, f"ema.start_step must be >= 0, got {self.start_step}")


class ParamEMA:
    """EMA shadows of ``params`` (one fp32 tensor per parameter, same local shard).

    No communication: each rank averages its own shards, which is exact because FSDP's
    optimizer step is shard-local too.
    """

    def __init__(self, params: Sequence[nn.Parameter], cfg: EMAConfig) -> None:
        self.cfg = cfg
        self.params = list(params)
        with torch.no_grad():
            self.shadows = [local_tensor(p).detach().clone().float() for p in self.params]

    @torch.no_grad()
    def update(self, step: int) -> bool:
        """Apply the rule of :class:`EMAConfig` after optimizer step ``step``; returns whether
        the average changed by the decay rule (``False`` while tracking or between intervals)."""
        current = [local_tensor(p).float() for p in self.params]
        if step < self.cfg.start_step:
            torch._foreach_copy_(self.shadows, current)
            return False
        if (step - self.cfg.start_step) % self.cfg.update_interval != 0:
            return False
        torch._foreach_mul_(self.shadows, self.cfg.decay)
        torch._foreach_add_(self.shadows, current, alpha=1.0 - self.cfg.decay)
        return True

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The parameters hold the EMA values inside the block, their own values after."""
        with torch.no_grad():
            locals_ = [local_tensor(p) for p in self.params]
            backup = [t.clone() for t in locals_]
            for t, s in zip(locals_, self.shadows, strict=True):
                t.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, b in zip(locals_, backup, strict=True):
                    t.copy_(b)

    def to(self, device: torch.device) -> int:
        """Move the shadows to ``device``; returns the bytes moved."""
        moved = 0
        for i, s in enumerate(self.shadows):
            if s.device != device:
                moved += s.numel() * s.element_size()
                self.shadows[i] = s.to(device)
        return moved
