"""Toy modules, a trainer backend on them, and an engine role for the weight-sync tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from unirl.distributed.weight_sync import (
    ModuleReceiver,
    SyncSource,
    WeightReceiver,
    compare_checksums,
)


class Attn(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = Attn(dim)
        self.norm = nn.LayerNorm(dim)


class Toy(nn.Module):
    """``transformer_blocks.{0,1}.attn.to_{q,k}`` + ``proj_out``: SD3-like names, 8-dim."""

    def __init__(self, dim: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.transformer_blocks = nn.ModuleList([Block(dim) for _ in range(2)])
        self.proj_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.transformer_blocks:
            x = b.norm(x + b.attn.to_q(x) * torch.sigmoid(b.attn.to_k(x)))
        return self.proj_out(x)


def trainer(lora: bool, seed: int = 0) -> Any:
    """An ``FSDPBackend`` on a ``Toy`` (LoRA r2 on to_q/to_k, or full), weights nudged away from init."""
    from unirl.train import FSDPBackend

    bundle = SimpleNamespace(transformer=Toy(seed=seed))
    cfg = {"rank": 2, "alpha": 4, "targets": ["to_q", "to_k"]} if lora else None
    backend = FSDPBackend(bundle=bundle, lora=cfg, param_dtype="fp32", device="cpu", seed=seed)
    nudge(backend, seed + 1)
    return backend


@torch.no_grad()
def nudge(backend: Any, seed: int) -> None:
    """A fake optimizer step: every trainable tensor moves."""
    gen = torch.Generator().manual_seed(seed)
    for _, p in backend.named_trainable_parameters():
        p.add_(torch.randn(p.shape, generator=gen) * 0.1)


class ToyEngine(WeightReceiver):
    """An engine role holding its own ``Toy`` copy (``dtype``) with a ``ModuleReceiver``."""

    engine_kind = "dedicated"

    def __init__(self, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        self.module = Toy(seed=seed).to(dtype).requires_grad_(False)
        self.receiver = ModuleReceiver(lambda: self.module, where="ToyEngine")

    def _weight_receiver(self) -> ModuleReceiver:
        return self.receiver


def local_sync(sync: Any, backend: Any, engine: Any) -> dict[str, Any]:
    """manifest -> prepare (fail fast) -> in-process push -> read-back comparison."""
    source = SyncSource(backend=backend, sync=sync, engine=engine)
    raw = source.manifest()
    manifest = raw.with_receiver_dtypes(engine.prepare_sync(raw), sync.wire_dtype)
    engine.prepare_sync(manifest)
    report = source.push_local(manifest)
    compare_checksums(report["expected"], report["checksums"], where="local_sync")
    return report


RECIPE = "diffusion/sd3_tiny_dedicated_separate"
