"""``gdpo_advantages`` vs a plain-Python implementation of per-component group normalisation,
weighting and batch renormalisation."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.algorithms import gdpo_advantages
from unirl.config import ConfigError

GROUPS = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _z(xs: list[float], eps: float) -> list[float]:
    if max(xs) == min(xs):
        return [0.0] * len(xs)
    m, s = sum(xs) / len(xs), _std(xs)
    return [(x - m) / (s + eps) for x in xs]


def _reference(components, weights, groups, eps, batch_norm, kept):
    n = len(groups)
    total = [0.0] * n
    for name, values in components.items():
        for g in set(groups[i] for i in range(n) if kept[i]):
            idx = [i for i in range(n) if groups[i] == g and kept[i]]
            for i, z in zip(idx, _z([values[i] for i in idx], eps)):
                total[i] += weights[name] * z
    if not batch_norm:
        return [t if k else 0.0 for t, k in zip(total, kept)]
    idx = [i for i in range(n) if kept[i]]
    out = [0.0] * n
    for i, z in zip(idx, _z([total[i] for i in idx], eps)):
        out[i] = z
    return out


def _components():
    gen = torch.Generator().manual_seed(0)
    return {
        "ocr": torch.rand(9, generator=gen),
        "aesthetic": 10.0
        * torch.randn(9, generator=gen),  # high variance: raw sums would drown ocr
        "format": torch.tensor(
            [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
        ),  # group 0 and 2 constant
    }


@pytest.mark.parametrize("batch_norm", [True, False])
def test_gdpo_matches_reference(batch_norm: bool) -> None:
    comps = _components()
    weights = {"ocr": 1.0, "aesthetic": 0.5, "format": 2.0}
    got = gdpo_advantages(comps, weights, GROUPS, eps=1e-6, batch_norm=batch_norm)
    ref = _reference(
        {k: v.double().tolist() for k, v in comps.items()},
        weights,
        GROUPS.tolist(),
        1e-6,
        batch_norm,
        [True] * 9,
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got.double(), torch.tensor(ref, dtype=torch.float64), atol=1e-6, rtol=1e-6
    )


def test_gdpo_normalises_before_weighting() -> None:
    comps = _components()
    weights = {"ocr": 1.0, "aesthetic": 1.0, "format": 1.0}
    scaled = dict(comps, aesthetic=comps["aesthetic"] * 1000.0)
    a = gdpo_advantages(comps, weights, GROUPS, batch_norm=False)
    b = gdpo_advantages(scaled, weights, GROUPS, batch_norm=False)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # a component's scale does not matter


def test_gdpo_dropped_samples_and_validation() -> None:
    comps = _components()
    weights = {"ocr": 1.0, "aesthetic": 0.5, "format": 2.0}
    kept = torch.tensor([True, True, False, True, True, True, True, False, True])
    got = gdpo_advantages(comps, weights, GROUPS, eps=1e-6, kept=kept)
    ref = _reference(
        {k: v.double().tolist() for k, v in comps.items()},
        weights,
        GROUPS.tolist(),
        1e-6,
        True,
        kept.tolist(),
    )
    torch.testing.assert_close(
        got.double(), torch.tensor(ref, dtype=torch.float64), atol=1e-6, rtol=1e-6
    )
    assert got[2].item() == 0.0 and got[7].item() == 0.0
    with pytest.raises(ConfigError, match="weights"):
        gdpo_advantages(comps, {"ocr": 1.0}, GROUPS)
    with pytest.raises(ConfigError, match="values"):
        gdpo_advantages({"ocr": torch.zeros(3)}, {"ocr": 1.0}, GROUPS)
    constant = gdpo_advantages({"ocr": torch.ones(9)}, {"ocr": 1.0}, GROUPS)
    assert torch.equal(constant, torch.zeros(9))
