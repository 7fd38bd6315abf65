"""DDPO's JPEG (in)compressibility rewards: the encoded size of each image at quality 95."""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from PIL import Image
from torch import Tensor

from unirl.config import require
from unirl.reward.base import (
    RewardBackend,
    ScoreResult,
    as_scores,
    check_images,
    check_lengths,
    images_to_uint8,
)

MAX_JPEG_THREADS = 8


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _jpeg_kb(pixels: np.ndarray, quality: int) -> float:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


def jpeg_size_kb(images: Tensor, quality: int = 95) -> list[float]:
    """JPEG size of each of ``images[N, 3, H, W]`` in kB (1 kB = 1000 bytes), encoded by PIL.

    PIL encodes without holding the GIL, so the images are encoded on a thread pool (one
    thread per image, at most the process's usable cores and ``MAX_JPEG_THREADS``); the order
    of the result is the input's.
    """
    arrays = list(images_to_uint8(images))
    workers = min(len(arrays), _usable_cpus(), MAX_JPEG_THREADS)
    if workers <= 1:
        return [_jpeg_kb(a, quality) for a in arrays]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_jpeg_kb, arrays, [quality] * len(arrays)))


@dataclass(kw_only=True)
class JpegCompressibility(RewardBackend):
    """Reward ``-size_kb``: smaller JPEG files (smoother, simpler images) score higher.
    ``quality``: the JPEG encoder's quality, 1-100."""

    quality: int = 95
    name: str = "jpeg_compressibility"
    sign: ClassVar[float] = -1.0

    def __post_init__(self) -> None:
        require(1 <= self.quality <= 100, f"{type(self).__name__}.quality must be in [1, 100]")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, type(self).__name__, metadata=metadata)
        images = check_images(images, n, type(self).__name__)
        sizes = jpeg_size_kb(images, self.quality)
        return ScoreResult(scores={self.name: as_scores([self.sign * s for s in sizes])})


@dataclass(kw_only=True)
class JpegIncompressibility(JpegCompressibility):
    """Reward ``+size_kb``: larger JPEG files (more detail and texture) score higher."""

    name: str = "jpeg_incompressibility"
    sign: ClassVar[float] = 1.0
