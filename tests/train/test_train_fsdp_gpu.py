"""FSDP2 on two CUDA processes (NCCL) with the production precision: bf16 frozen base, fp32
LoRA master, FSDP bf16 compute / fp32 reduce, activation checkpointing; offload / onload of
sharded parameters and optimizer state; checkpoint round trip. Skipped without 2 GPUs."""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from train_fakes import TARGETS, TinyBundle, loss_of, make_backend, output, transformer_inputs

from unirl.train import EMAConfig, FSDPConfig, LoraConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]
LORA = LoraConfig(rank=3, alpha=6.0, targets=list(TARGETS), extra_adapters=["old"])
FSDP = FSDPConfig(param_dtype="bf16", reduce_dtype="fp32", activation_checkpointing=True)


def _backend(seed: int = 5):
    return make_backend(
        bundle=TinyBundle(),
        lora=LORA,
        ema=EMAConfig(decay=0.5),
        seed=seed,
        device="cuda",
        param_dtype="bf16",
        fsdp=FSDP,
    )


def _step(backend, inputs) -> float:
    backend.zero_grad()
    loss_of(backend, inputs).backward()
    norm = backend.clip_grad_norm(1.0)
    backend.optimizer_step()
    return norm


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120)
    )
    try:
        from torch.distributed.tensor import DTensor

        backend, twin = _backend(), _backend()
        for name, p in backend.module.named_parameters():
            assert isinstance(p, DTensor) and p.device.type == "cuda", name
            want = torch.float32 if ".lora_" in name else torch.bfloat16
            assert p.dtype == want, (name, p.dtype)
        batch = {
            k: v[rank * 2 : rank * 2 + 2].cuda() for k, v in transformer_inputs(4, seed=11).items()
        }
        probe = {k: v.cuda() for k, v in transformer_inputs(4, seed=12).items()}
        norms = [_step(b, batch) for b in (backend, twin)]
        assert norms[0] == norms[1] and norms[0] > 0
        before = output(backend, probe)
        assert before.dtype == torch.bfloat16

        moved = backend.offload()
        assert moved > 0 and backend.moved_bytes["offload"] == moved
        assert all(p.to_local().device.type == "cpu" for p in backend.module.parameters())
        assert all(
            v.device.type == "cpu"
            for s in backend.optimizer.state.values()
            for v in s.values()
            if v.dim() > 0
        )
        assert backend.onload() == moved
        assert torch.equal(output(backend, probe), before)
        _step(backend, batch)
        _step(twin, batch)
        a, b = backend.full_trainable_state(), twin.full_trainable_state()
        assert all(torch.equal(a[k], b[k]) for k in a), "offload/onload changed training"

        backend.sync_adapter("old", decay=0.5)
        backend.save_checkpoint(Path(out_dir) / "ckpt", extra={"k": 1})
        restored = _backend(seed=6)
        assert restored.load_checkpoint(Path(out_dir) / "ckpt") == {"k": 1}
        a, b = backend.full_trainable_state(), restored.full_trainable_state()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert all(
            torch.equal(x, y)
            for x, y in zip(backend._ema.shadows, restored._ema.shadows, strict=True)
        )
        with backend.set_active_adapter("old"), restored.set_active_adapter("old"):
            assert torch.equal(output(backend, probe), output(restored, probe))
        with backend.adapter_disabled():
            base = output(backend, probe)
        assert not torch.equal(base, output(backend, probe))
        torch.save({"state": {k: v.cpu() for k, v in a.items()}}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_fsdp2_nccl_bf16_offload_and_checkpoint(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True)["state"] for r in range(2))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
