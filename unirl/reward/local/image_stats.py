"""Cheap image statistics used as anti-reward-hacking guards (logged, not rewarded)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from unirl.config import require
from unirl.reward.base import RewardBackend, ScoreResult, as_scores, check_images, check_lengths

_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601


def luminance(images: Tensor) -> Tensor:
    """``images[N, 3, H, W]`` -> ``luma[N, H, W]`` with BT.601 weights."""
    weights = torch.tensor(_LUMA, dtype=images.dtype, device=images.device)
    return torch.einsum("nchw,c->nhw", images, weights)


def dark_fraction(images: Tensor, threshold: float) -> Tensor:
    """Returns ``fraction[N]`` of pixels with luminance strictly below ``threshold``."""
    return (luminance(images) < threshold).float().mean(dim=(1, 2))


def color_entropy(images: Tensor, bins: int) -> Tensor:
    """Returns ``entropy[N]`` in bits of the histogram of colours quantised to ``bins`` per channel.

    Range ``[0, 3·log2(bins)]``: 0 for a flat image, high for noise.
    """
    n = images.shape[0]
    levels = (images.clamp(0.0, 1.0) * bins).long().clamp(max=bins - 1)  # [N, 3, H, W]
    codes = (levels[:, 0] * bins + levels[:, 1]) * bins + levels[:, 2]  # [N, H, W]
    offsets = torch.arange(n, device=images.device).view(n, 1, 1) * bins**3
    counts = torch.bincount((codes + offsets).flatten(), minlength=n * bins**3)
    probs = counts.view(n, bins**3).float()
    probs = probs / probs.sum(dim=1, keepdim=True)
    terms = torch.where(probs > 0, -probs * torch.log2(probs), torch.zeros_like(probs))
    return terms.sum(dim=1)


def edge_density(images: Tensor, threshold: float) -> Tensor:
    """Returns ``fraction[N]`` of interior pixels whose Sobel gradient magnitude exceeds ``threshold``.

    The gradient is of luminance, divided by 4 so a unit step has magnitude 1; only the
    ``(H-2)·(W-2)`` positions with a full 3x3 window count (no padding, so borders are not edges).
    """
    luma = luminance(images).unsqueeze(1)  # [N, 1, H, W]
    kx = torch.tensor(
        [[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=luma.dtype, device=luma.device
    )
    kernels = torch.stack([kx, kx.t()]).unsqueeze(1) / 4.0  # [2, 1, 3, 3]
    grad = F.conv2d(luma, kernels)  # [N, 2, H-2, W-2]
    magnitude = grad.pow(2).sum(dim=1).sqrt()
    return (magnitude > threshold).float().mean(dim=(1, 2))


ROWS_PER_BLOCK = 256


def streamed_stats(
    images: Tensor, dark_threshold: float, bins: int, edge_threshold: float
) -> dict[str, Tensor]:
    """``dark_fraction``, ``color_entropy`` and ``edge_density`` (each ``[N]`` float32) of
    ``images[N, 3, H, W]``, the same values as the whole-tensor functions above, computed
    image by image, ``ROWS_PER_BLOCK`` rows at a time (plus a row each side for the Sobel
    window): the working memory is that of one block, not ``N x H x W`` int64 codes and float
    copies (four 4096x4096 images took 7 GB at once before)."""
    n, _, h, w = images.shape
    out = {k: torch.zeros(n, dtype=torch.float64) for k in ("dark", "entropy", "edges")}
    for i in range(n):
        dark = edges = 0
        counts = torch.zeros(bins**3, dtype=torch.int64, device=images.device)
        for r0 in range(0, h, ROWS_PER_BLOCK):
            r1 = min(h, r0 + ROWS_PER_BLOCK)
            block = images[i : i + 1, :, r0:r1].to(torch.float32)
            dark += int((luminance(block) < dark_threshold).sum())
            levels = (block.clamp(0.0, 1.0) * bins).to(torch.int32).clamp(max=bins - 1)
            codes = (levels[:, 0] * bins + levels[:, 1]) * bins + levels[:, 2]
            counts += torch.bincount(codes.flatten(), minlength=bins**3)
            c0, c1 = max(r0, 1), min(r1, h - 1)  # window centres of this block
            if c1 > c0:
                window = images[i : i + 1, :, c0 - 1 : c1 + 1].to(torch.float32)
                edges += int(_edge_magnitude(window).gt(edge_threshold).sum())
        probs = counts.double() / counts.sum()
        terms = torch.where(probs > 0, -probs * torch.log2(probs), torch.zeros_like(probs))
        out["dark"][i] = dark / (h * w)
        out["entropy"][i] = terms.sum()
        out["edges"][i] = edges / ((h - 2) * (w - 2))
    return {
        "dark_fraction": out["dark"].float(),
        "color_entropy": out["entropy"].float(),
        "edge_density": out["edges"].float(),
    }


def _edge_magnitude(images: Tensor) -> Tensor:
    """Sobel gradient magnitude ``[N, H-2, W-2]`` of the luminance, divided by 4."""
    luma = luminance(images).unsqueeze(1)
    kx = torch.tensor(
        [[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=luma.dtype, device=luma.device
    )
    kernels = torch.stack([kx, kx.t()]).unsqueeze(1) / 4.0
    return F.conv2d(luma, kernels).pow(2).sum(dim=1).sqrt()


@dataclass(kw_only=True)
class ImageStats(RewardBackend):
    """Per-image ``dark_fraction``, ``color_entropy`` (bits) and ``edge_density``.

    Use as ``RewardService.guards`` to spot reward hacking (images going black, collapsing to
    flat colour, or turning into noise) while a reward rises.

    ``dark_threshold``: luminance below which a pixel counts as dark, in (0, 1];
    ``entropy_bins``: levels per channel of the colour histogram (2-32); ``edge_threshold``:
    Sobel gradient magnitude above which an interior pixel counts as an edge.
    """

    dark_threshold: float = 0.1
    entropy_bins: int = 8
    edge_threshold: float = 0.2

    def __post_init__(self) -> None:
        require(0.0 < self.dark_threshold <= 1.0, "ImageStats.dark_threshold must be in (0, 1]")
        require(2 <= self.entropy_bins <= 32, "ImageStats.entropy_bins must be in [2, 32]")
        require(self.edge_threshold > 0.0, "ImageStats.edge_threshold must be > 0")

    @property
    def names(self) -> tuple[str, ...]:
        return ("dark_fraction", "color_entropy", "edge_density")

    @property
    def max_entropy_bits(self) -> float:
        return 3.0 * math.log2(self.entropy_bins)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "ImageStats", metadata=metadata)
        images = check_images(images, n, "ImageStats").to(self.device)
        require(
            images.shape[2] >= 3 and images.shape[3] >= 3,
            "ImageStats needs images of at least 3x3 pixels",
        )
        with torch.no_grad():  # block by block: bounded memory at any image size
            stats = streamed_stats(
                images, self.dark_threshold, self.entropy_bins, self.edge_threshold
            )
        return ScoreResult(scores={k: as_scores(v) for k, v in stats.items()})
