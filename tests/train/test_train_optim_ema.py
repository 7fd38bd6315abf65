"""EMA rule, EMA swap, LR schedules, gradient clipping and configs of FSDPBackend."""

from __future__ import annotations

import math

import pytest
import torch
from train_fakes import make_backend, output, train_step, transformer_inputs

from unirl.config import ConfigError
from unirl.train import EMAConfig, LoraConfig, LRScheduleConfig, OptimizerConfig
from unirl.train.optim import lr_factor


def _params(backend) -> list[torch.Tensor]:
    return [p.detach().clone() for p in backend.trainable_parameters()]


def test_ema_rule_exact_with_start_step_and_interval() -> None:
    decay = 0.75
    backend = make_backend(ema=EMAConfig(decay=decay, update_interval=2, start_step=2))
    shadows = backend._ema.shadows
    assert all(torch.equal(s, p) for s, p in zip(shadows, _params(backend), strict=True))
    expected = _params(backend)
    for step in range(1, 8):
        train_step(backend, transformer_inputs(2, seed=step))
        current = _params(backend)
        if step < 2:
            expected = [c.clone() for c in current]  # tracks the parameters
        elif (step - 2) % 2 == 0:
            expected = [
                e.mul(decay).add(c, alpha=1 - decay) for e, c in zip(expected, current, strict=True)
            ]
        for s, e in zip(shadows, expected, strict=True):
            assert torch.equal(s, e), step
    # Not trivially equal to the parameters after decayed updates.
    assert not all(torch.equal(s, c) for s, c in zip(shadows, current, strict=True))


def test_ema_weights_swap_in_and_restore_exactly() -> None:
    backend = make_backend(ema=EMAConfig(decay=0.5))
    inputs = transformer_inputs(2)
    for step in range(3):
        train_step(backend, transformer_inputs(2, seed=10 + step))
    own = _params(backend)
    own_out = output(backend, inputs)
    with backend.ema_weights():
        inside = _params(backend)
        ema_out = output(backend, inputs)
    assert all(torch.equal(a, s) for a, s in zip(inside, backend._ema.shadows, strict=True))
    assert not torch.equal(ema_out, own_out)
    assert all(torch.equal(a, b) for a, b in zip(_params(backend), own, strict=True))
    assert torch.equal(output(backend, inputs), own_out)
    # An exception inside still restores.
    with pytest.raises(RuntimeError, match="boom"), backend.ema_weights():
        raise RuntimeError("boom")
    assert all(torch.equal(a, b) for a, b in zip(_params(backend), own, strict=True))


def test_ema_weights_needs_ema() -> None:
    with pytest.raises(ConfigError, match=r"backend\.ema"), make_backend().ema_weights():
        pass


def test_lr_schedules() -> None:
    warm = LRScheduleConfig(kind="warmup_constant", warmup_steps=4)
    assert [lr_factor(warm, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = LRScheduleConfig(kind="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    got = [lr_factor(cos, s) for s in range(8)]
    want = [0.5, 1.0] + [
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 2) / 4))) for s in range(2, 8)
    ]
    assert got == pytest.approx(want, abs=1e-12)
    assert (
        got[2] == pytest.approx(1.0)
        and got[6] == pytest.approx(0.1)
        and got[7] == pytest.approx(0.1)
    )
    # The backend's lr follows the schedule step by step.
    backend = make_backend(lr=0.02, lr_schedule=cos)
    seen = []
    for _ in range(4):
        seen.append(backend.lr)
        backend.optimizer_step()  # no grads: AdamW skips, the schedule still advances
    assert seen == pytest.approx([0.02 * f for f in want[:4]], rel=1e-12)
    assert backend.step == 4


def test_clip_grad_norm_value_clipping_and_non_finite() -> None:
    backend = make_backend()
    inputs = transformer_inputs(2)
    train_step(backend, inputs)
    backend.zero_grad()
    backend.module(**inputs).sample.pow(2).mean().backward()
    grads = [p.grad.clone() for p in backend.trainable_parameters()]
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    assert backend.clip_grad_norm(None) == pytest.approx(norm, rel=1e-5)
    assert all(
        torch.equal(p.grad, g) for p, g in zip(backend.trainable_parameters(), grads, strict=True)
    )
    assert backend.clip_grad_norm(norm / 4) == pytest.approx(norm, rel=1e-5)
    clipped = math.sqrt(
        sum(float(p.grad.double().pow(2).sum()) for p in backend.trainable_parameters())
    )
    assert clipped == pytest.approx(norm / 4, rel=1e-4)

    first = backend.trainable_parameters()[0]
    for bad in (float("nan"), float("inf")):
        first.grad[0, 0] = bad
        before = [p.grad.clone() for p in backend.trainable_parameters()]
        value = backend.clip_grad_norm(1e-3)
        assert math.isnan(value) if math.isnan(bad) else math.isinf(value)
        after = [p.grad for p in backend.trainable_parameters()]  # untouched, bad value included
        assert all(
            torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(after, before, strict=True)
        )
    backend.zero_grad()
    assert backend.clip_grad_norm(1.0) == 0.0  # no gradients at all


def test_offload_onload_on_cpu_moves_nothing_and_training_continues() -> None:
    backend = make_backend(ema=EMAConfig(decay=0.5))
    inputs = transformer_inputs(2)
    train_step(backend, inputs)
    before = output(backend, inputs)
    assert backend.offload() == 0 and backend.onload() == 0
    assert backend.moved_bytes == {"offload": 0, "onload": 0}
    assert torch.equal(output(backend, inputs), before)
    train_step(backend, inputs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_offload_onload_round_trip_on_cuda() -> None:
    backend = make_backend(device="cuda", ema=EMAConfig(decay=0.5), param_dtype="bf16")
    inputs = {k: v.to("cuda", torch.bfloat16) for k, v in transformer_inputs(2).items()}
    train_step(backend, inputs)
    before = output(backend, inputs)
    state_bytes = sum(
        v.numel() * v.element_size()
        for s in backend.optimizer.state.values()
        for v in s.values()
        if v.dim() > 0
    )
    module_bytes = sum(
        t.numel() * t.element_size()
        for t in [*backend.module.parameters(), *backend.module.buffers()]
    )
    ema_bytes = sum(s.numel() * s.element_size() for s in backend._ema.shadows)
    moved = backend.offload()
    assert moved == module_bytes + state_bytes + ema_bytes
    assert all(p.device.type == "cpu" for p in backend.module.parameters())
    assert backend.onload() == moved
    assert torch.equal(output(backend, inputs), before)
    train_step(backend, inputs)


def test_config_validation_messages_name_the_field() -> None:
    cases = [
        (lambda: LoraConfig(rank=0), "lora.rank"),
        (lambda: LoraConfig(init_lora_weights="pissa"), "lora.init_lora_weights"),
        (lambda: LoraConfig(extra_adapters=["default"]), "lora.extra_adapters"),
        (lambda: OptimizerConfig(lr=0), "optimizer.lr"),
        (lambda: OptimizerConfig(betas=(0.9, 1.0)), "optimizer.betas"),
        (lambda: LRScheduleConfig(kind="linear"), "lr_schedule.kind"),
        (lambda: LRScheduleConfig(kind="cosine", warmup_steps=5, total_steps=5), "total_steps"),
        (lambda: LRScheduleConfig(kind="constant", warmup_steps=3), "warmup_constant"),
        (lambda: EMAConfig(decay=1.0), "ema.decay"),
        (lambda: make_backend(param_dtype="fp8"), "backend.param_dtype"),
        (lambda: make_backend(device="tpu"), "backend.device"),
    ]
    for build, field in cases:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            build()


def test_hydra_style_mappings_are_accepted() -> None:
    backend = make_backend(
        lora={"rank": 2, "alpha": 4, "targets": ["to_q"]},
        ema={"decay": 0.5},
        lr_schedule={"kind": "warmup_constant", "warmup_steps": 2},
        fsdp={"block_class_names": ["JointTransformerBlock"]},
    )
    assert backend.lora == LoraConfig(rank=2, alpha=4, targets=["to_q"])
    assert backend.has_ema and backend.lr == pytest.approx(1e-2 / 2)
    assert OptimizerConfig(betas=[0.8, 0.9]).betas == (0.8, 0.9)
