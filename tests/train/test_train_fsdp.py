"""Data parallel on two CPU processes (gloo): FSDP2 (base sharded or replicated) and the
replicate mode (whole module per rank, one gradient all-reduce per step). One data-parallel
step equals one single-process step on the concatenated batch; clipping, EMA, the base-model
switch, the frozen "old" adapter and the checkpoint round trip work in every mode (uneven
shards: LoRA rank 3). ``shard_frozen_fused`` runs the sharded mode with the fused q / k / v
attention processor (``bundle.fuse_projections``) against the single-process reference with
diffusers' processor; ``shard_frozen_gather`` samples with the blocks kept gathered
(``fsdp.gather_for_sampling``) before its step."""

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

WORLD = 2
BATCH = 4  # 2 samples per rank
MAX_NORM = 1e-4  # below the gradient norm: clipping is exercised
LORA = LoraConfig(rank=3, alpha=6.0, targets=list(TARGETS), extra_adapters=["old"])


MODES = {
    "shard_frozen": FSDPConfig(shard_frozen=True),
    "replicate_frozen": FSDPConfig(shard_frozen=False),
    "replicate_dp": FSDPConfig(data_parallel="replicate"),
    "shard_frozen_fused": FSDPConfig(shard_frozen=True),
    "shard_frozen_gather": FSDPConfig(shard_frozen=True, gather_for_sampling=True),
}


def _backend(seed: int = 5, mode: str = "shard_frozen"):
    bundle = TinyBundle()
    if mode.endswith("_fused"):
        from unirl.models.sd3.attention import install_fused_attention

        install_fused_attention(bundle.transformer)
    return make_backend(
        bundle=bundle, lora=LORA, ema=EMAConfig(decay=0.5), seed=seed, fsdp=MODES[mode]
    )


def _step(backend, inputs) -> float:
    backend.zero_grad()
    loss_of(backend, inputs).backward()  # mean over this rank's samples
    norm = backend.clip_grad_norm(MAX_NORM)
    backend.optimizer_step()
    return norm


def _sample_gathered(backend, full_batch, base: torch.Tensor) -> None:
    """Between TrainOps.begin_sampling and end_sampling the parameters (a block's and the
    root's own) stay gathered after a forward (no all-gather for the next one); outside they
    are resharded after every forward. The outputs are the sharded run's, bit for bit."""
    from torch.distributed.tensor import DTensor

    from unirl.trainer.roles import TrainOps

    # a block and two of the root's own modules (FSDP2 swaps the registered parameters)
    watched = [backend.module.transformer_blocks[0], backend.module.proj_out]
    watched.append(backend.module.context_embedder)

    def gathered() -> bool:
        kinds = {isinstance(p, DTensor) for m in watched for p in m.parameters()}
        assert len(kinds) == 1, "some watched parameters are gathered, others not"
        return kinds == {False}

    with torch.no_grad():
        outside = output(backend, full_batch)
        assert not gathered()
        ops = TrainOps(backend=backend, pipeline=None)
        assert ops.begin_sampling("train") is None
        first = output(backend, full_batch)
        assert gathered()
        assert torch.equal(output(backend, full_batch), first)
        with backend.adapter_disabled():
            assert torch.equal(output(backend, full_batch), base)
        assert gathered()
        ops.end_sampling()
        assert not gathered()
        assert torch.equal(first, outside)
        assert torch.equal(output(backend, full_batch), outside)
        assert not gathered()


def _worker(rank: int, port: int, out_dir: str, mode: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60)
    )
    try:
        torch.set_num_threads(1)
        if mode == "replicate_dp":  # many small buckets: every gradient crosses a bucket edge
            import unirl.train.parallel as parallel

            parallel.GRAD_BUCKET_BYTES = 1024
        # every rank draws a different LoRA init: replicate mode must broadcast rank 0's
        backend = _backend(seed=5 + (rank if mode == "replicate_dp" else 0), mode=mode)
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        frozen = [
            p
            for n, p in backend.module.named_parameters()
            if not p.requires_grad and "lora_" not in n
        ]
        if mode == "replicate_dp":
            from unirl.train.parallel import all_reduce_grads

            both, one, none = (torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 4))
            both.grad = torch.full((3,), float(rank + 1))
            if rank == 0:
                one.grad = torch.full((2,), 2.0)
            all_reduce_grads([both, one, none])
            assert torch.equal(both.grad, torch.full((3,), 1.5))  # averaged
            assert torch.equal(one.grad, torch.ones(2))  # zeros where a rank had none
            assert none.grad is None  # no rank touched it: the optimizer skips it
            assert backend.is_replicated and not backend.is_sharded
            assert not isinstance(backend.module, FSDPModule)
            assert not any(isinstance(p, DTensor) for p in backend.module.parameters())
        else:
            assert backend.is_sharded and isinstance(backend.module, FSDPModule)
            assert all(isinstance(p, DTensor) for p in backend.trainable_parameters())
            sharded_frozen = mode.startswith("shard_frozen")
            assert all(isinstance(p, DTensor) == sharded_frozen for p in frozen)
        if mode.endswith("_fused"):
            from unirl.models.sd3.attention import FusedJointAttnProcessor

            processors = [m.processor for m in backend.module.modules() if hasattr(m, "processor")]
            assert processors
            assert all(isinstance(p, FusedJointAttnProcessor) for p in processors)
        full_batch = transformer_inputs(BATCH, seed=11)
        mine = {k: v[rank * 2 : rank * 2 + 2] for k, v in full_batch.items()}
        with backend.adapter_disabled():
            base = output(backend, full_batch)
        if mode.endswith("_gather"):
            _sample_gathered(backend, full_batch, base)
        norm = _step(backend, mine)
        after = output(backend, full_batch)
        with backend.adapter_disabled():
            base_after = output(backend, full_batch)
        with backend.set_active_adapter("old"):
            old = output(backend, full_batch)
        with backend.ema_weights():
            ema_state = backend.full_trainable_state()
            ema_out = output(backend, full_batch)
        result = {
            "norm": norm,
            "state": backend.full_trainable_state(),
            "ema": ema_state,
            "out": after,
            "ema_out": ema_out,
            "base": base,
            "base_after": base_after,
            "old": old,
            "lora_export": backend.adapter_state_dict(),
        }

        # Checkpoint round trip into a differently initialised sharded backend.
        backend.sync_adapter("old", decay=0.5)
        backend.save_checkpoint(Path(out_dir) / "ckpt", extra={"step": 1})
        restored = _backend(seed=6, mode=mode)
        assert restored.load_checkpoint(Path(out_dir) / "ckpt") == {"step": 1}
        a, b = backend.full_trainable_state(), restored.full_trainable_state()
        assert all(torch.equal(a[k], b[k]) for k in a)
        for p, q in zip(
            backend.trainable_parameters(), restored.trainable_parameters(), strict=True
        ):
            sa, sb = backend.optimizer.state[p], restored.optimizer.state[q]
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(
                    sa[key].full_tensor() if isinstance(sa[key], DTensor) else sa[key],
                    sb[key].full_tensor() if isinstance(sb[key], DTensor) else sb[key],
                ), key
        assert all(
            torch.equal(x, y)
            for x, y in zip(backend._ema.shadows, restored._ema.shadows, strict=True)
        )
        assert restored.step == 1 and restored.lr == backend.lr
        with backend.set_active_adapter("old"), restored.set_active_adapter("old"):
            assert torch.equal(output(backend, full_batch), output(restored, full_batch))
        # Both continue identically.
        result["norm2"] = (_step(backend, mine), _step(restored, mine))
        a, b = backend.full_trainable_state(), restored.full_trainable_state()
        result["continued_equal"] = all(torch.equal(a[k], b[k]) for k in a)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()  # leave together: a rank tearing gloo down under a busy peer aborts it
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=list(MODES))
def ranks(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(_free_port(), str(out), request.param), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_ranks_agree_and_match_one_process_on_the_whole_batch(ranks: list[dict]) -> None:
    r0, r1 = ranks
    assert r0["state"].keys() == r1["state"].keys()
    assert all(torch.equal(r0["state"][k], r1["state"][k]) for k in r0["state"])
    assert r0["norm"] == r1["norm"]

    single = _backend()
    full_batch = transformer_inputs(BATCH, seed=11)
    with single.adapter_disabled():
        base = output(single, full_batch)
    norm = _step(single, full_batch)
    assert norm > MAX_NORM
    assert r0["norm"] == pytest.approx(norm, rel=1e-5)
    ref = single.full_trainable_state()
    assert ref.keys() == r0["state"].keys()
    for k in ref:
        torch.testing.assert_close(r0["state"][k], ref[k], atol=1e-6, rtol=0)
    torch.testing.assert_close(r0["out"], output(single, full_batch), atol=1e-5, rtol=0)
    torch.testing.assert_close(r0["base"], base, atol=1e-6, rtol=0)
    with single.ema_weights():
        ema_ref = single.full_trainable_state()
    for k in ema_ref:
        torch.testing.assert_close(r0["ema"][k], ema_ref[k], atol=1e-6, rtol=0)
    exported = single.adapter_state_dict()
    assert exported.keys() == r0["lora_export"].keys()
    for k in exported:
        torch.testing.assert_close(r0["lora_export"][k], exported[k], atol=1e-6, rtol=0)


def test_sharded_switches_and_checkpoint(ranks: list[dict]) -> None:
    for r in ranks:
        assert torch.equal(r["base_after"], r["base"])  # adapter-disabled is the frozen base
        assert float((r["out"] - r["base"]).abs().max()) > 1e-4  # the step moved the adapter
        assert torch.equal(r["old"], r["base"])  # "old" is still the identity copy
        assert not torch.equal(r["ema_out"], r["out"])  # EMA (decay 0.5) lags the parameters
        assert r["continued_equal"]
        assert r["norm2"][0] == r["norm2"][1]
