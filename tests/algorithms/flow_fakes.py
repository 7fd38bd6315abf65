"""A minimal flow-matching "family" for algorithm tests: a 1x1-conv velocity on tiny latents,
driven by the real ``sample_trajectory`` / ``FlowMatchingPipeline.replay``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from unirl.models.common.denoise import sample_trajectory
from unirl.models.common.pipeline import FlowMatchingPipeline
from unirl.sde import FlowSDE, flow_match_sigmas
from unirl.types import LatentSegment, TextEmbedConditions

CHANNELS, SIDE, EMBED = 2, 4, 3


class TinyBundle:
    """``v = conv1x1(x)·(1 + σ) + Linear(mean embeds)`` — enough structure for real gradients."""

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.device = torch.device("cpu")
        self.conv = torch.nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.cond = torch.nn.Linear(EMBED, CHANNELS)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        self.scheduler_config: dict[str, object] = {}

    def parameters(self) -> list[torch.nn.Parameter]:
        return [*self.conv.parameters(), *self.cond.parameters()]

    def encode_prompts(self, texts: list[str], negative_prompt: str = "") -> TextEmbedConditions:
        rows = [torch.full((2, EMBED), float(len(t))) for t in texts]
        return TextEmbedConditions(embeds=torch.stack(rows))

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditions: TextEmbedConditions
    ) -> torch.Tensor:
        x = latents.float()
        shift = self.cond(conditions.embeds.float().mean(dim=1))[:, :, None, None]
        return self.conv(x) * (1.0 + sigma.float().view(-1, 1, 1, 1)) + shift

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        return (CHANNELS, height // 8, width // 8)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        x = latents.float().mean(dim=1, keepdim=True).expand(-1, 3, -1, -1)
        return torch.sigmoid(x)


class TinyPipeline(FlowMatchingPipeline):
    def cfg_conditions(self, conditions: TextEmbedConditions) -> TextEmbedConditions:  # type: ignore[override]
        return TextEmbedConditions(
            embeds=torch.cat([torch.zeros_like(conditions.embeds), conditions.embeds])
        )


def make_pipeline(
    strategy: object | None = None,
    *,
    storage_dtype: str = "fp32",
    record_means: bool = False,
    record_uncond: bool = False,
) -> TinyPipeline:
    return TinyPipeline(
        bundle=TinyBundle(),
        strategy=strategy if strategy is not None else FlowSDE(eta=0.7),
        storage_dtype=storage_dtype,
        record_means=record_means,
        record_uncond=record_uncond,
    )


def sample(
    pipeline: TinyPipeline,
    *,
    n: int = 4,
    steps: int = 5,
    sde_indices: torch.Tensor | None = None,
    guidance_scale: float = 1.0,
    seed: int = 0,
) -> tuple[TextEmbedConditions, LatentSegment]:
    """Sample ``n`` trajectories with the real denoise loop; default trained steps: per pair of
    samples a different window, so one replay slot mixes σ values."""
    gen = torch.Generator().manual_seed(seed)
    conditions = TextEmbedConditions(embeds=torch.randn(n, 2, EMBED, generator=gen))
    if sde_indices is None:
        sde_indices = torch.tensor([[0, 1, 2] if i % 4 < 2 else [1, 2, 3] for i in range(n)])
    x_T = torch.randn(n, CHANNELS, SIDE, SIDE, generator=gen)
    noise = torch.randn(n, sde_indices.shape[1], CHANNELS, SIDE, SIDE, generator=gen)
    segment = sample_trajectory(
        pipeline,
        conditions=conditions,
        x_T=x_T,
        sigmas=flow_match_sigmas(steps, shift=3.0),
        sde_indices=sde_indices,
        sde_noise=noise,
        strategy=pipeline.strategy,
        guidance_scale=guidance_scale,
        storage_dtype=pipeline.storage_dtype,
        record_means=pipeline.record_means,
        record_uncond=pipeline.record_uncond,
        policy_version=pipeline.policy_version,
    )
    return conditions, segment


def anchor(algorithm, conditions, segment, micro: int, advantages: torch.Tensor) -> list[tuple]:
    """``TrainStack``'s step 2: freeze π_old per micro-batch, before any update."""
    out = []
    for start in range(0, len(advantages), micro):
        idx = torch.arange(start, min(start + micro, len(advantages)))
        cond = conditions.select(idx)
        out.append((cond, algorithm.prepare_segment(cond, segment.select(idx)), advantages[idx]))
    return out


def update(algorithm, prepared: list[tuple]) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss + backward per micro-batch; returns the summed loss and the concatenated terms."""
    n = sum(len(adv) for _, _, adv in prepared)
    results = [
        algorithm.compute_loss_and_backward(c, s, a, loss_scale=len(a) / n) for c, s, a in prepared
    ]
    terms = {k: torch.cat([r.terms[k] for r in results]) for k in results[0].terms}
    return sum(r.loss for r in results), terms


def run_update(
    algorithm, conditions, segment, micro: int, advantages: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Anchor, then one loss + backward pass (what one optimizer step of TrainStack does)."""
    return update(algorithm, anchor(algorithm, conditions, segment, micro, advantages))[1]


@contextlib.contextmanager
def perturbed(bundle: TinyBundle, scale: float = 0.05, seed: int = 1) -> Iterator[None]:
    """A stand-in for ``adapter_disabled``: temporarily different weights (the "reference")."""
    gen = torch.Generator().manual_seed(seed)
    saved = [p.detach().clone() for p in bundle.parameters()]
    with torch.no_grad():
        for p in bundle.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(bundle.parameters(), saved, strict=True):
                p.copy_(s)


def sgd_step(bundle: TinyBundle, lr: float) -> None:
    with torch.no_grad():
        for p in bundle.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
                p.grad = None


def zero_grad(bundle: TinyBundle) -> None:
    for p in bundle.parameters():
        p.grad = None
