"""The differentiable brightness equals BrightnessTarget's score (the logged reward) and its
gradient is the closed form −sign(mean − target)/(C·H·W) per pixel."""

from __future__ import annotations

import torch

from unirl.reward.differentiable import DifferentiableBrightness
from unirl.reward.local import BrightnessTarget


def test_value_equals_the_scorer_and_gradient_is_closed_form() -> None:
    gen = torch.Generator().manual_seed(0)
    pixels = torch.rand(5, 3, 8, 6, generator=gen)
    pixels[0] = 0.9  # above the target: the gradient flips sign
    scored = BrightnessTarget(target=0.6).score(pixels, ["p"] * 5, [{}] * 5).scores["brightness"]
    leaf = pixels.clone().requires_grad_(True)
    values = DifferentiableBrightness(target=0.6)(leaf)
    assert torch.equal(values.detach(), scored.float())
    values.sum().backward()
    mean = pixels.double().mean(dim=(1, 2, 3))
    expected = (-torch.sign(mean - 0.6) / (3 * 8 * 6)).view(5, 1, 1, 1).expand_as(pixels)
    torch.testing.assert_close(leaf.grad.double(), expected, atol=1e-9, rtol=0.0)
    assert float(leaf.grad[0].max()) < 0  # brighter than the target: darken
