"""Wan 2.2 with both experts training under FSDP2 on two CPU processes (gloo): the backend
shards ``WanExperts`` as one root, and the bundle calls the experts through it, so the
parameters outside the blocks are gathered. One sharded step (the same sample on both
ranks, a trained σ on each side of the boundary) equals the single-process step."""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
SIGMAS = (0.95, 0.3)  # one row for each expert (boundary 0.875)


def _step() -> dict[str, torch.Tensor]:
    from unirl.models.wan import WanBundle
    from unirl.train import FSDPBackend, LoraConfig
    from unirl.train.parallel import full_tensor

    bundle = WanBundle(
        path="tiny-wan2.2",
        dtype="fp32",
        text_encoder_dtype="fp32",
        device="cpu",
        max_sequence_length=16,
    )
    backend = FSDPBackend(bundle=bundle, lora=LoraConfig(rank=2, alpha=4), param_dtype="fp32")
    cond = bundle.encode_prompts(["a cat", "a dog"])
    x = torch.randn(2, 16, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    backend.zero_grad()
    bundle.predict_velocity(x, torch.tensor(SIGMAS), cond).pow(2).mean().backward()
    backend.optimizer_step()
    with torch.no_grad():
        after = bundle.predict_velocity(x, torch.tensor(SIGMAS), cond)
    state = {n: full_tensor(p).detach().clone() for n, p in backend.named_trainable_parameters()}
    state["velocity_after"] = after
    state["sharded"] = torch.tensor(float(backend.is_sharded))
    return state


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120)
    )
    try:
        torch.set_num_threads(1)
        state = _step()
        if rank == 0:
            torch.save(state, Path(out) / "sharded.pt")
        dist.barrier()  # leave together: a rank tearing gloo down under a busy peer aborts it
    finally:
        dist.destroy_process_group()


def test_both_experts_train_sharded_as_in_one_process(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=WORLD)
    sharded = torch.load(tmp_path / "sharded.pt")
    single = _step()
    assert float(sharded.pop("sharded")) == 1.0 and float(single.pop("sharded")) == 0.0
    assert sharded.keys() == single.keys()
    moved = {"transformer": 0.0, "transformer_2": 0.0}
    for name, value in single.items():
        assert torch.allclose(sharded[name], value, atol=1e-6, rtol=0), name
        if "lora_B" in name:
            expert = name.split(".", 1)[0]
            moved[expert] = max(moved[expert], float(value.abs().max()))
    assert moved["transformer"] > 0 and moved["transformer_2"] > 0, moved
