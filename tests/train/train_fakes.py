"""Shared pieces of the training-backend tests: a tiny SD3 transformer, a minimal bundle,
seeded inputs, and a backend factory."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import SD3Transformer2DModel

from unirl.train import EMAConfig, FSDPBackend, LoraConfig, OptimizerConfig
from unirl.types import LatentSegment, RolloutTrack, TextEmbedConditions

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
TINY_CONFIG: dict[str, Any] = dict(
    sample_size=8,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    caption_projection_dim=32,
    pooled_projection_dim=32,
    pos_embed_max_size=16,
    qk_norm="rms_norm",
)


def tiny_transformer(seed: int = 0) -> SD3Transformer2DModel:
    """Random-init fp32 SD3 transformer (2 joint blocks, 2 heads of 16)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SD3Transformer2DModel(**TINY_CONFIG)


class TinyBundle:
    """The two attributes the backend reads: ``trainable_module`` and ``transformer``."""

    block_class_names = ("JointTransformerBlock",)
    lora_default_targets = tuple(TARGETS)

    def __init__(self, transformer: torch.nn.Module | None = None) -> None:
        self.transformer = transformer if transformer is not None else tiny_transformer()

    @property
    def trainable_module(self) -> torch.nn.Module:
        return self.transformer


def transformer_inputs(
    batch: int, *, seed: int = 1, config: Any = None, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Seeded inputs for a transformer with ``config`` (default: the tiny one)."""
    cfg = dict(config) if config is not None else TINY_CONFIG
    g = torch.Generator().manual_seed(seed)
    size = cfg["sample_size"]
    out = {
        "hidden_states": torch.randn(batch, cfg["in_channels"], size, size, generator=g),
        "encoder_hidden_states": torch.randn(batch, 5, cfg["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(batch, cfg["pooled_projection_dim"], generator=g),
        "timestep": torch.rand(batch, generator=g) * 1000,
    }
    return {k: v.to(dtype) for k, v in out.items()}


def make_backend(
    *,
    bundle: TinyBundle | None = None,
    lora: LoraConfig | str | None = "default",
    ema: EMAConfig | None = None,
    param_dtype: str = "fp32",
    lr: float = 1e-2,
    seed: int = 0,
    **kwargs: Any,
) -> FSDPBackend:
    if lora == "default":
        lora = LoraConfig(rank=4, alpha=8.0, targets=list(TARGETS))
    return FSDPBackend(
        bundle=bundle if bundle is not None else TinyBundle(),
        lora=lora,
        ema=ema,
        optimizer=OptimizerConfig(lr=lr, weight_decay=0.0),
        param_dtype=param_dtype,
        seed=seed,
        **kwargs,
    )


def loss_of(backend: FSDPBackend, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean squared output: a loss with non-zero gradients for every LoRA tensor."""
    return backend.module(**inputs).sample.float().pow(2).mean()


def train_step(
    backend: FSDPBackend, inputs: dict[str, torch.Tensor], max_norm: float | None = None
) -> float:
    backend.zero_grad()
    loss_of(backend, inputs).backward()
    norm = backend.clip_grad_norm(max_norm)
    backend.optimizer_step()
    return norm


@torch.no_grad()
def output(backend: FSDPBackend, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return backend.module(**inputs).sample


def empty_track(n: int) -> RolloutTrack:
    """A track of ``n`` samples with no trained SDE step and zero advantages: what a fake
    algorithm that ignores its inputs needs to drive ``TrainStack.train``."""
    segment = LatentSegment(
        sigmas=torch.linspace(1, 0, 3), sde_indices=torch.zeros(n, 0, dtype=torch.long)
    )
    return RolloutTrack(
        sample_ids=torch.arange(n),
        group_ids=torch.zeros(n, dtype=torch.long),
        conditions=TextEmbedConditions(embeds=torch.zeros(n, 1, 1)),
        segment=segment,
        advantages=torch.zeros(n),
    )
