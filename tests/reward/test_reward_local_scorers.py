"""JPEG (in)compressibility, ImageStats guards and the quick-start target rewards."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from unirl.config import ConfigError
from unirl.reward import RewardError
from unirl.reward.local import (
    BrightnessTarget,
    ColorTarget,
    ImageStats,
    JpegCompressibility,
    JpegIncompressibility,
    jpeg_size_kb,
)


def _smooth_and_noise() -> torch.Tensor:
    ramp = torch.linspace(0, 1, 64).view(1, 1, 64).expand(3, 64, 64)
    noise = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    return torch.stack([ramp, noise])


def test_jpeg_size_matches_pil_encoding_in_kilobytes():
    images = _smooth_and_noise()
    pixels = (images[1] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    assert jpeg_size_kb(images)[1] == len(buffer.getvalue()) / 1000.0


def test_jpeg_rewards_order_smooth_above_noise_and_have_opposite_signs():
    images = _smooth_and_noise()
    prompts, meta = ["a", "b"], [{}, {}]
    comp = JpegCompressibility().score(images, prompts, meta).scores["jpeg_compressibility"]
    incomp = JpegIncompressibility().score(images, prompts, meta).scores["jpeg_incompressibility"]
    assert comp.dtype == torch.float32 and comp.shape == (2,)
    assert bool((comp < 0).all()) and bool((incomp > 0).all())
    assert comp[0] > comp[1]  # the smooth ramp compresses better than noise
    assert incomp[1] > incomp[0]
    assert torch.equal(comp, -incomp)


def test_image_stats_on_constructed_images():
    n, h, w = 4, 10, 12
    images = torch.zeros(n, 3, h, w)
    images[1] = 1.0  # white
    images[2, :, :, : w // 2] = 1.0  # left half white, right half black
    images[3, :, :5] = 1.0  # top half white -> luminance 1; bottom half stays 0.0
    images[3, :, 5:, :] = 0.05  # bottom half dark grey (below the 0.1 threshold)
    result = ImageStats().score(images, ["p"] * n, [{}] * n)
    dark = result.scores["dark_fraction"]
    entropy = result.scores["color_entropy"]
    edges = result.scores["edge_density"]
    assert dark.tolist() == [1.0, 0.0, 0.5, 0.5]
    # flat images have zero entropy; two equally frequent colours have exactly 1 bit
    assert entropy.tolist() == pytest.approx([0.0, 0.0, 1.0, 1.0], abs=1e-6)
    # a vertical step is seen by 2 of the (w-2) valid Sobel columns, on every row
    assert edges[0] == 0.0 and edges[1] == 0.0
    assert edges[2].item() == pytest.approx(2 / (w - 2), abs=1e-6)
    assert edges[3].item() == pytest.approx(2 / (h - 2), abs=1e-6)


def test_image_stats_entropy_of_noise_is_near_its_maximum():
    stats = ImageStats(entropy_bins=4)
    noise = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    value = stats.score(noise, ["p"], [{}]).scores["color_entropy"].item()
    assert stats.max_entropy_bits == 6.0
    assert 5.9 < value <= 6.0


def test_brightness_and_color_targets():
    images = torch.zeros(2, 3, 4, 4)
    images[0] = 0.8
    images[1, 0] = 1.0  # pure red: mean brightness 1/3
    bright = BrightnessTarget(target=0.8).score(images, ["a", "b"], [{}, {}]).scores["brightness"]
    assert bright.tolist() == pytest.approx([0.0, -(0.8 - 1 / 3)], abs=1e-6)
    red = ColorTarget(rgb=[1.0, 0.0, 0.0]).score(images, ["a", "b"], [{}, {}])
    assert red.scores["color_target"].tolist() == pytest.approx(
        [-(0.2 + 0.8 + 0.8) / 3, 0.0], abs=1e-6
    )
    with pytest.raises(ConfigError, match="rgb"):
        ColorTarget(rgb=(1.0, 0.0))


def test_scorers_reject_wrong_image_shapes():
    with pytest.raises(RewardError, match=r"\[N=2, 3, H, W\]"):
        BrightnessTarget().score(torch.zeros(2, 4, 4), ["a", "b"], [{}, {}])
    with pytest.raises(RewardError, match="needs images"):
        JpegCompressibility().score(None, ["a"], [{}])


def test_uint8_conversion_rounds_and_clamps():
    from unirl.reward.base import images_to_uint8

    images = torch.tensor([-0.5, 0.0, 0.5, 1.0, 1.5]).view(1, 1, 1, 5).expand(1, 3, 1, 5)
    out = images_to_uint8(images)
    assert out.shape == (1, 1, 5, 3) and out.dtype == np.uint8
    assert out[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255]
