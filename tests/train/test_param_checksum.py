"""``TrainStack.param_checksum``: Σx + Σx² over every trainable parameter in fp64, whatever
the chunking of the flattened parameters."""

from __future__ import annotations

import types

import pytest
import torch

from unirl.train import stack as stack_module
from unirl.train.stack import TrainStack


def _stack_over(params: list[torch.Tensor]) -> TrainStack:
    stack = TrainStack.__new__(TrainStack)  # only the backend is read
    stack.backend = types.SimpleNamespace(
        device=torch.device("cpu"), trainable_parameters=lambda: iter(params)
    )
    return stack


def _reference(params: list[torch.Tensor]) -> float:
    return sum(float(p.double().sum() + p.double().square().sum()) for p in params)


@pytest.mark.parametrize("chunk", [1 << 26, 100, 7, 1])
def test_checksum_is_the_fp64_sum_and_square_sum_at_any_chunk(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_module, "CHECKSUM_CHUNK", chunk)
    gen = torch.Generator().manual_seed(0)
    # LoRA-like: many small fp32 tensors, one larger than the small chunks, one scalar
    params = [torch.randn(32, 48, generator=gen) for _ in range(9)]
    params += [torch.randn(300, generator=gen), torch.randn((), generator=gen)]
    got = _stack_over(params).param_checksum()
    assert got == pytest.approx(_reference(params), rel=1e-12)


def test_checksum_moves_with_a_one_ulp_change_and_is_zero_for_nothing() -> None:
    params = [torch.ones(1000), torch.full((10,), 2.0)]
    before = _stack_over(params).param_checksum()
    assert before == pytest.approx(1000 * 2 + 10 * (2 + 4))
    params[0][500] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    assert _stack_over(params).param_checksum() != before
    assert _stack_over([]).param_checksum() == 0.0
