"""``TrainOps.count_flops`` attributes the trained modules' FLOPs once each, also when two of
them share a class (Wan 2.2's two experts): the counter already sums both into one entry."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from unirl.trainer.roles import TrainOps

DIM, ROWS = 8, 3
LINEAR_FLOPS = 2 * ROWS * DIM * DIM  # one [ROWS, DIM] x [DIM, DIM] matmul


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Decoder(Expert):
    """A frozen module of another class: its FLOPs are in the total only."""


@dataclasses.dataclass
class FakeTrack:
    rewards: torch.Tensor | None = None

    def __len__(self) -> int:
        return ROWS

    def compute_advantages(self) -> tuple[FakeTrack, dict[str, float]]:
        return self, {}


class Experts(nn.Module):
    """Both experts as one module called at the top level (Wan 2.2's ``WanExperts`` when both
    train): the counter names them by attribute, not by class."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = Expert()
        self.transformer_2 = Expert()

    def forward(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, name)(x)


class FakePipeline:
    """``generate`` runs each expert once at the top level (as the Wan bundle calls them)
    and the decoder once."""

    track_name = "diffusion"

    def __init__(self, experts: dict[str, nn.Module], container: Experts | None = None) -> None:
        self.bundle = SimpleNamespace(trainable_modules=experts)
        if container is not None:
            self.bundle.trainable_module = container
        self.container = container
        self.decoder = Decoder()

    def generate(self, req: Any) -> Any:
        x = torch.randn(ROWS, DIM)
        with torch.no_grad():
            for name, module in self.bundle.trainable_modules.items():
                x = module(x) if self.container is None else self.container(name, x)
            self.decoder(x)
        return SimpleNamespace(tracks={self.track_name: FakeTrack()})


class FakeStack:
    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def train_track(self, track: FakeTrack, rollout_index: int) -> None:
        # forward: 1 matmul; backward: 1 (the weight's gradient; the input needs none)
        self.module(torch.randn(ROWS, DIM)).sum().backward()


def count(experts: dict[str, nn.Module], container: Experts | None = None) -> dict[str, float]:
    pipeline = FakePipeline(experts, container)
    ops = TrainOps(backend=None, pipeline=pipeline, stack=FakeStack(next(iter(experts.values()))))
    [row] = ops.count_flops(None, 0)
    return row


def test_two_experts_of_one_class_are_counted_once_each() -> None:
    row = count({"transformer": Expert(), "transformer_2": Expert()})
    assert row["rollout_total"] == 3 * LINEAR_FLOPS
    assert row["rollout_transformer"] == 2 * LINEAR_FLOPS  # both experts, neither twice
    assert row["train_transformer"] == row["train_total"] == 2 * LINEAR_FLOPS
    assert row["samples"] == ROWS


def test_one_trained_module() -> None:
    row = count({"transformer": Expert()})
    assert row["rollout_total"] == 2 * LINEAR_FLOPS
    assert row["rollout_transformer"] == LINEAR_FLOPS
    assert row["train_transformer"] == 2 * LINEAR_FLOPS


def test_experts_called_through_their_container_are_counted() -> None:
    container = Experts()
    experts = {"transformer": container.transformer, "transformer_2": container.transformer_2}
    row = count(experts, container)
    assert row["rollout_total"] == 3 * LINEAR_FLOPS
    assert row["rollout_transformer"] == 2 * LINEAR_FLOPS


def test_fused_attention_flops_count_grouped_query_heads_as_torch_does() -> None:
    """The bench's own formulas for the fused attention kernels (the GPU image's torch asserts
    equal heads and failed Qwen-Image's count): grouped-query attention is counted at the
    query's 8 heads, equal to this torch's own formula, forward and backward."""
    from torch.utils.flop_counter import FlopCounterMode

    from unirl.trainer.roles import attention_flop_formulas, attention_flops

    b, h_q, h_kv, s_q, s_k, d = 2, 8, 2, 16, 12, 4
    q = torch.empty(b, h_q, s_q, d, device="meta", dtype=torch.float16)
    k = torch.empty(b, h_kv, s_k, d, device="meta", dtype=torch.float16)
    v = torch.empty(b, h_kv, s_k, d, device="meta", dtype=torch.float16)
    expected = 4 * b * h_q * s_q * s_k * d  # QK^T and PV, 2 FLOPs per multiply-add
    aten = torch.ops.aten
    calls = {
        aten._scaled_dot_product_flash_attention: lambda: aten._scaled_dot_product_flash_attention(
            q, k, v
        ),
        aten._scaled_dot_product_efficient_attention: lambda: (
            aten._scaled_dot_product_efficient_attention(q, k, v, None, False)
        ),
        aten._scaled_dot_product_cudnn_attention: lambda: aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, False
        ),
    }
    formulas = attention_flop_formulas()
    for op, call in calls.items():
        with FlopCounterMode(display=False, custom_mapping=formulas) as ours:
            call()
        with FlopCounterMode(display=False) as stock:
            call()
        assert ours.get_total_flops() == stock.get_total_flops() == expected, op
    for name in ("flash", "efficient", "cudnn"):
        backward = formulas[getattr(aten, f"_scaled_dot_product_{name}_attention_backward")]
        assert backward(q.shape, q.shape, k.shape, v.shape, None) == 2 * expected
    assert attention_flops((1, 4, 3, 8), (1, 4, 5, 8), (1, 4, 5, 2)) == 2 * 4 * 3 * 5 * (8 + 2)
    with pytest.raises(Exception, match="not \\[b, h, s, d\\]"):
        attention_flops((1, 6, 3, 8), (1, 4, 5, 8), (1, 4, 5, 8))  # 6 heads over 4
