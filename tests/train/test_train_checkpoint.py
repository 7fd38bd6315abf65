"""Checkpoint round trip (parameters, optimizer, schedule, EMA, step, RNG, extra) and the
atomic write of FSDPBackend."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from train_fakes import TARGETS, make_backend, output, train_step, transformer_inputs

from unirl.train import CheckpointError, EMAConfig, LoraConfig, LRScheduleConfig
from unirl.train import checkpoint as ckpt_module

SCHEDULE = LRScheduleConfig(kind="cosine", warmup_steps=1, total_steps=10)
LORA = LoraConfig(rank=3, alpha=6.0, targets=list(TARGETS), extra_adapters=["old"])


def _trained(seed: int = 0, steps: int = 3, **kwargs):
    backend = make_backend(seed=seed, ema=EMAConfig(decay=0.5), lr_schedule=SCHEDULE, **kwargs)
    for step in range(steps):
        train_step(backend, transformer_inputs(2, seed=step))
    return backend


def _optimizer_tensors(backend) -> list[torch.Tensor]:
    out = []
    for p in backend.trainable_parameters():
        state = backend.optimizer.state[p]
        out += [state["exp_avg"], state["exp_avg_sq"], state["step"]]
    return out


def _draws() -> tuple[torch.Tensor, float, float]:
    return torch.rand(3), float(np.random.rand()), random.random()


def _assert_same_state(a, b) -> None:
    assert a.step == b.step
    assert a.lr == b.lr
    assert a.scheduler.state_dict() == b.scheduler.state_dict()
    sa, sb = a.full_trainable_state(), b.full_trainable_state()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert all(
        torch.equal(x, y) for x, y in zip(_optimizer_tensors(a), _optimizer_tensors(b), strict=True)
    )
    if a.has_ema:
        assert all(torch.equal(x, y) for x, y in zip(a._ema.shadows, b._ema.shadows, strict=True))


def test_lora_round_trip_restores_everything(tmp_path: Path) -> None:
    src = _trained(lora=LORA)
    src.sync_adapter("old", decay=0.5)  # make "old" differ from both init and "default"
    path = tmp_path / "step_3"
    torch.manual_seed(123)
    np.random.seed(7)
    random.seed(9)
    src.save_checkpoint(path, extra={"global_step": 3, "note": "hi", "t": torch.arange(3)})
    expected_draws = _draws()

    meta = json.loads((path / "trainer_state.json").read_text())
    assert (
        meta["kind"] == "adapter" and meta["step"] == 3 and meta["adapters"] == ["default", "old"]
    )
    from safetensors.torch import load_file

    saved = load_file(str(path / "model.safetensors"))
    assert all(".lora_" in k for k in saved)  # adapter-only
    assert any(".old." in k for k in saved) and any(".default." in k for k in saved)

    dst = make_backend(
        seed=99, lora=LORA, ema=EMAConfig(decay=0.5), lr_schedule=SCHEDULE
    )  # other init
    assert not torch.equal(
        *(
            s["transformer_blocks.0.attn.to_q.lora_A.default.weight"]
            for s in (src.full_trainable_state(), dst.full_trainable_state())
        )
    )
    torch.manual_seed(0)  # disturb the RNGs; loading must put them back
    extra = dst.load_checkpoint(path)
    assert (
        extra["global_step"] == 3
        and extra["note"] == "hi"
        and torch.equal(extra["t"], torch.arange(3))
    )
    got_draws = _draws()
    assert torch.equal(got_draws[0], expected_draws[0]) and got_draws[1:] == expected_draws[1:]
    _assert_same_state(src, dst)
    inputs = transformer_inputs(2, seed=50)
    assert torch.equal(output(dst, inputs), output(src, inputs))
    with src.set_active_adapter("old"), dst.set_active_adapter("old"):
        assert torch.equal(output(dst, inputs), output(src, inputs))
    # Training continues identically from the restored state.
    for b in (src, dst):
        train_step(b, transformer_inputs(2, seed=77))
    _assert_same_state(src, dst)


def test_full_model_round_trip(tmp_path: Path) -> None:
    src = _trained(lora=None, steps=2)
    src.save_checkpoint(tmp_path / "full")
    meta = json.loads((tmp_path / "full" / "trainer_state.json").read_text())
    assert meta["kind"] == "full" and meta["adapters"] == []
    dst = make_backend(lora=None, ema=EMAConfig(decay=0.5), lr_schedule=SCHEDULE)
    with torch.no_grad():
        for p in dst.module.parameters():
            p.add_(1.0)
    assert dst.load_checkpoint(tmp_path / "full") == {}
    _assert_same_state(src, dst)
    sa, sb = src.module.state_dict(), dst.module.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # buffers too


def test_crash_mid_write_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _trained(steps=1)
    path = tmp_path / "latest"
    backend.save_checkpoint(path, extra={"v": 1})
    first = {k: v.clone() for k, v in backend.full_trainable_state().items()}
    train_step(backend, transformer_inputs(2, seed=5))

    calls = {"n": 0}
    real = ckpt_module._save_tensors

    def crash_on_second(tensors, file):  # model written, then the EMA file fails
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full (simulated)")
        real(tensors, file)

    monkeypatch.setattr(ckpt_module, "_save_tensors", crash_on_second)
    with pytest.raises(CheckpointError, match=r"ema\.safetensors failed.*simulated"):
        backend.save_checkpoint(path, extra={"v": 2})
    calls["n"] = 0
    with pytest.raises(CheckpointError, match="simulated"):
        backend.save_checkpoint(tmp_path / "fresh", extra={"v": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no tmp / partial dirs
    monkeypatch.setattr(ckpt_module, "_save_tensors", real)

    check = make_backend(ema=EMAConfig(decay=0.5), lr_schedule=SCHEDULE)
    assert check.load_checkpoint(path) == {"v": 1}
    got = check.full_trainable_state()
    assert all(torch.equal(got[k], first[k]) for k in first)
    # Overwriting an existing checkpoint in place works and leaves no sibling behind.
    backend.save_checkpoint(path, extra={"v": 3})
    assert check.load_checkpoint(path) == {"v": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_load_refuses_mismatched_checkpoints(tmp_path: Path) -> None:
    _trained(steps=1).save_checkpoint(tmp_path / "adapter")
    with pytest.raises(CheckpointError, match=r"'adapter'.*'full'"):
        make_backend(lora=None).load_checkpoint(tmp_path / "adapter")
    with pytest.raises(CheckpointError, match="adapters"):
        make_backend(lora=LORA).load_checkpoint(tmp_path / "adapter")
    with pytest.raises(CheckpointError, match="adapter tensors differ"):
        make_backend(lora=LoraConfig(rank=4, targets=["to_q"])).load_checkpoint(
            tmp_path / "adapter"
        )
    # the same tensors at another rank: named with the shapes, before any tensor is copied
    with pytest.raises(CheckpointError) as info:
        make_backend(lora=LoraConfig(rank=2, alpha=4.0, targets=list(TARGETS))).load_checkpoint(
            tmp_path / "adapter"
        )
    message = str(info.value)
    assert message.startswith(f"checkpoint {tmp_path / 'adapter'} does not fit this model: ")
    assert re.search(r"lora_[AB]\.default\.weight is \[(4, \d+|\d+, 4)\] there, ", message)
    assert message.endswith(
        "here (and 15 more); resume with the recipe that wrote it (backend.lora.rank differs "
        "from that run's)"
    )
    with pytest.raises(CheckpointError, match="no checkpoint"):
        make_backend().load_checkpoint(tmp_path / "missing")
