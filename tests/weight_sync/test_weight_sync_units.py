"""Weight sync without Ray: checksums, name remap, fail-fast manifest checks, buckets, the
gloo sync group, LoRA / full / merged / wire-dtype transfers into an engine copy, transport
rules and the CUDA-IPC guards."""

from __future__ import annotations

import threading

import pytest
import torch
from sync_fakes import ToyEngine, local_sync, nudge, trainer

from unirl.config import ConfigError
from unirl.distributed.weight_sync import (
    CudaIpcSync,
    FullSync,
    LoraSync,
    NameRemap,
    SyncGroup,
    SyncManifest,
    TensorMeta,
    WeightSyncError,
    build_ipc_payload,
    check_manifest,
    compare_checksums,
    expected_checksum,
    free_port,
    open_ipc_payload,
    pack,
    plan_buckets,
    tensor_checksum,
    unpack,
)
from unirl.distributed.weight_sync.ipc import IpcPayload

# -- checksums ----------------------------------------------------------------------------------


def test_checksum_is_bit_exact_and_position_sensitive() -> None:
    t = torch.randn(64, 32)
    assert tensor_checksum(t) == tensor_checksum(t.clone())
    flipped = t.clone()
    flipped.view(torch.int32)[3, 7] ^= 1  # one mantissa bit
    assert tensor_checksum(flipped) != tensor_checksum(t)
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert tensor_checksum(swapped) != tensor_checksum(t)  # same multiset of values, other order
    assert tensor_checksum(t.reshape(32, 64)) != tensor_checksum(t)  # shape is part of it
    assert tensor_checksum(t.to(torch.bfloat16)) != tensor_checksum(t.to(torch.float16))


def test_checksum_does_not_depend_on_thread_count() -> None:
    t = torch.randn(300_001)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tensor_checksum(t)
        torch.set_num_threads(2)
        two = tensor_checksum(t)
    finally:
        torch.set_num_threads(threads)
    assert one == two


def test_expected_checksum_follows_the_casts() -> None:
    t = torch.randn(16, 16)
    want = tensor_checksum(t.to(torch.bfloat16).to(torch.float32))
    assert expected_checksum(t, wire_dtype=torch.bfloat16, target_dtype=torch.float32) == want
    assert want != tensor_checksum(t)


# -- name remap and manifest checks --------------------------------------------------------------


def test_name_remap_prefix_regex_and_wrapper_tokens() -> None:
    remap = NameRemap(
        [
            {"prefix": "transformer_blocks.", "to": "blocks."},
            {"regex": r"\.attn\.", "to": ".attention."},
        ]
    )
    assert (
        remap("_fsdp_wrapped_module.transformer_blocks.3._orig_mod.attn.to_q.weight")
        == "blocks.3.attention.to_q.weight"
    )
    assert remap("proj_out.weight") == "proj_out.weight"
    with pytest.raises(ConfigError, match=r"exactly one of `prefix` or `regex`"):
        NameRemap([{"prefix": "a", "regex": "b"}])
    with pytest.raises(ConfigError, match=r"unknown key"):
        NameRemap([{"prefix": "a", "too": "b"}])


def _manifest(names: list[str], shape=(4, 4), dtype="torch.float32", kind="full") -> SyncManifest:
    return SyncManifest(
        kind=kind,
        entries=tuple(
            TensorMeta(name=n, source="t." + n, shape=shape, dtype=dtype, wire_dtype="")
            for n in names
        ),
    )


def test_check_manifest_fails_fast_naming_tensors() -> None:
    table = {
        "a.weight": torch.zeros(4, 4),
        "b.weight": torch.zeros(4, 4),
        "step": torch.zeros(4, 4, dtype=torch.long),
    }
    assert check_manifest(_manifest(["a.weight"]), table, where="x", require_complete=False) == {
        "a.weight": "torch.float32"
    }
    with pytest.raises(
        WeightSyncError,
        match=r"zero parameters would be updated.*Unmatched parameters: x.weight \(trainer: t.x.weight\)",
    ):
        check_manifest(_manifest(["x.weight"]), table, where="x", require_complete=False)
    with pytest.raises(
        WeightSyncError, match=r"1 of 2 full tensors match no engine parameter.*zz.weight"
    ):
        check_manifest(
            _manifest(["a.weight", "zz.weight"]), table, where="x", require_complete=False
        )
    with pytest.raises(
        WeightSyncError, match=r"shape mismatch.*a.weight: trainer \[2, 8\] vs engine \[4, 4\]"
    ):
        check_manifest(
            _manifest(["a.weight"], shape=(2, 8)), table, where="x", require_complete=False
        )
    with pytest.raises(WeightSyncError, match=r"dtype mismatch.*step"):
        check_manifest(_manifest(["step"]), table, where="x", require_complete=False)
    with pytest.raises(WeightSyncError, match=r"would never be updated.*b.weight"):
        check_manifest(
            _manifest(["a.weight"]),
            {k: table[k] for k in ("a.weight", "b.weight")},
            where="x",
            require_complete=True,
        )


def test_compare_checksums_names_the_differences() -> None:
    compare_checksums({"a": 1, "b": 2}, {"a": 1, "b": 2}, where="w")
    with pytest.raises(WeightSyncError, match=r"differ from the trainer's: b"):
        compare_checksums({"a": 1, "b": 2}, {"a": 1, "b": 3}, where="w")
    with pytest.raises(WeightSyncError, match=r"not read back: b"):
        compare_checksums({"a": 1, "b": 2}, {"a": 1}, where="w")
    with pytest.raises(WeightSyncError, match=r"zero tensors synced"):
        compare_checksums({}, {}, where="w")


# -- buckets and the sync group ----------------------------------------------------------------------


def _wire_entries() -> tuple[list[TensorMeta], dict[str, torch.Tensor]]:
    tensors = {
        "a": torch.randn(5, 3),
        "b": torch.randn(7).to(torch.bfloat16),
        "c": torch.arange(9),
        "d": torch.randn(2, 2),
    }
    entries = [
        TensorMeta(
            name=n, source=n, shape=tuple(t.shape), dtype=str(t.dtype), wire_dtype=str(t.dtype)
        )
        for n, t in tensors.items()
    ]
    return entries, tensors


def test_buckets_round_trip_mixed_dtypes() -> None:
    entries, tensors = _wire_entries()
    buckets = plan_buckets(entries, bucket_bytes=96)
    assert [[s.name for s in b.slots] for b in buckets] == [["a", "b"], ["c", "d"]]
    assert all(s.offset % 16 == 0 for b in buckets for s in b.slots)
    small = plan_buckets(entries, bucket_bytes=64)  # a tensor larger than a bucket gets its own
    assert [[s.name for s in b.slots] for b in small] == [["a"], ["b"], ["c"], ["d"]] and small[
        2
    ].nbytes == 80
    out = {}
    for b in buckets:
        out.update(unpack(b, pack(b, tensors, torch.device("cpu"))))
    for n, t in tensors.items():
        assert out[n].dtype == t.dtype and torch.equal(out[n], t)


def test_sync_group_broadcasts_buckets_over_gloo() -> None:
    entries, tensors = _wire_entries()
    buckets = plan_buckets(entries, bucket_bytes=64)
    port, world, got, errors = free_port(), 3, {}, []

    def member(rank: int) -> None:
        try:
            group = SyncGroup(
                host="127.0.0.1",
                port=port,
                rank=rank,
                world_size=world,
                backend="gloo",
                timeout_s=60,
            )
            mine = {}
            for b in buckets:
                buf = (
                    pack(b, tensors, torch.device("cpu"))
                    if rank == 0
                    else torch.empty(b.nbytes, dtype=torch.uint8)
                )
                group.broadcast(buf, src=0)
                mine.update({k: v.clone() for k, v in unpack(b, buf).items()})
            group.barrier()
            got[rank] = mine
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(world)]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    assert not errors, errors
    for rank in (1, 2):
        assert all(torch.equal(got[rank][n], tensors[n]) for n in tensors)


# -- transfers into an engine copy ------------------------------------------------------------------


def _same_output(backend, engine, atol: float = 0.0) -> bool:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = backend.module(x)
        got = engine.module(x.to(next(engine.module.parameters()).dtype)).float()
    return torch.allclose(got, want, atol=atol, rtol=0.0)


def test_lora_sync_injects_an_equal_adapter_and_reads_back() -> None:
    backend, engine = trainer(lora=True), ToyEngine()
    assert not _same_output(backend, engine, atol=1e-4)
    report = local_sync(LoraSync(), backend, engine)
    assert report["num_tensors"] == 8  # 2 blocks x (to_q, to_k) x (A, B)
    assert sorted(engine.checksums("lora"))[0] == "transformer_blocks.0.attn.to_k.lora_A.weight"
    assert _same_output(backend, engine, atol=1e-6)
    nudge(backend, 99)  # "train", sync again: the copy follows
    assert not _same_output(backend, engine, atol=1e-4)
    local_sync(LoraSync(), backend, engine)
    assert _same_output(backend, engine, atol=1e-6)


def test_merged_lora_folds_the_delta_without_drift() -> None:
    backend, engine = trainer(lora=True), ToyEngine()
    pristine = engine.module.transformer_blocks[0].attn.to_q.weight.detach().clone()
    report = local_sync(LoraSync(merged_lora=True), backend, engine)
    assert report["merged"] is True and engine.receiver.lora_merged()
    assert _same_output(backend, engine, atol=1e-6)
    for step in range(3):  # repeated syncs restore the pristine base before merging
        nudge(backend, 10 + step)
        local_sync(LoraSync(merged_lora=True), backend, engine)
        assert _same_output(backend, engine, atol=1e-6)
    layer = engine.module.transformer_blocks[0].attn.to_q
    delta = layer.get_delta_weight("default")
    assert torch.allclose(layer.get_base_layer().weight, pristine + delta, atol=1e-7, rtol=0)


def test_full_sync_with_bf16_wire_into_fp32_copy() -> None:
    backend, engine = trainer(lora=False), ToyEngine()
    report = local_sync(FullSync(wire_dtype="bf16"), backend, engine)
    assert report["num_tensors"] == len(backend.named_trainable_parameters())
    live = dict(backend.named_trainable_parameters())
    got = engine.checksums("full")
    name = "transformer_blocks.1.attn.to_q.weight"
    assert got[name] == tensor_checksum(live[name].detach().to(torch.bfloat16).float())
    assert got[name] != tensor_checksum(live[name].detach())  # it did travel as bf16
    assert _same_output(backend, engine, atol=5e-2)


def test_full_sync_into_bf16_engine_copy() -> None:
    backend, engine = trainer(lora=False), ToyEngine(dtype=torch.bfloat16)
    local_sync(FullSync(), backend, engine)  # wire = the engine's dtype
    live = dict(backend.named_trainable_parameters())
    for name, value in engine.checksums("full").items():
        assert value == tensor_checksum(live[name].detach().to(torch.bfloat16))


def test_wrong_name_remap_fails_before_any_byte_moves() -> None:
    backend, engine = trainer(lora=False), ToyEngine()
    before = engine.checksums("full")
    with pytest.raises(
        WeightSyncError,
        match=r"12 of 14 full tensors match no engine parameter\. Unmatched parameters: blocks\.0\.attn\.to_q\.weight \(trainer: transformer_blocks\.0\.attn\.to_q\.weight\)",
    ):
        local_sync(
            FullSync(name_remap=[{"prefix": "transformer_blocks.", "to": "blocks."}]),
            backend,
            engine,
        )
    assert engine.checksums("full") == before


def test_sync_kind_must_match_the_backend() -> None:
    with pytest.raises(ConfigError, match=r"backend.lora is null; use sync._target_=.*FullSync"):
        local_sync(LoraSync(), trainer(lora=False), ToyEngine())
    with pytest.raises(ConfigError, match=r"use sync._target_=.*LoraSync"):
        local_sync(FullSync(), trainer(lora=True), ToyEngine())


def test_lora_settings_change_is_refused() -> None:
    backend, engine = trainer(lora=True), ToyEngine()
    local_sync(LoraSync(), backend, engine)
    config = dict(engine.receiver.lora_config)
    config["r"] = 4
    with pytest.raises(WeightSyncError, match=r"LoRA settings changed"):
        engine.receiver.ensure_lora(config)


# -- transports and CUDA IPC guards ---------------------------------------------------------------


def test_transport_rules() -> None:
    assert LoraSync().transport_for("separate") == "object_store"
    assert FullSync().transport_for("separate") == "collective"
    assert FullSync().transport_for("colocate") == "local"
    with pytest.raises(ConfigError, match=r"transport=collective .* needs layout=separate"):
        FullSync(transport="collective").transport_for("colocate")
    with pytest.raises(ConfigError, match=r"transport=local .* needs layout=colocate"):
        LoraSync(transport="local").transport_for("separate")
    with pytest.raises(ConfigError, match=r"not available for LoraSync"):
        LoraSync(transport="cuda_ipc")
    with pytest.raises(ConfigError, match=r"CudaIpcSync .* needs layout=colocate"):
        CudaIpcSync().transport_for("separate")


def test_cuda_ipc_is_guarded_on_cpu() -> None:
    sync = CudaIpcSync()
    with pytest.raises(ConfigError, match=r"CUDA IPC cannot run on CPU"):
        sync.check_backend(trainer(lora=True))
    assert sync.kind == "lora"  # payload=auto resolved against the backend
    with pytest.raises(WeightSyncError, match=r"not on a CUDA device"):
        build_ipc_payload({"w": torch.zeros(2)})
    import os
    import socket

    with pytest.raises(WeightSyncError, match=r"runs in the sender's own process"):
        open_ipc_payload(IpcPayload(pid=os.getpid(), host=socket.gethostname(), handles=()))
    with pytest.raises(WeightSyncError, match=r"within one node only"):
        open_ipc_payload(IpcPayload(pid=-1, host="elsewhere", handles=()))


def test_lora_sync_moves_the_named_source_adapter() -> None:
    """``source_adapter: old`` (DiffusionNFT on an external engine): the engine receives the
    old adapter's tensors under the trained adapter's name, not the trained ones."""
    from types import SimpleNamespace

    from sync_fakes import Toy

    from unirl.distributed.weight_sync.base import strip_adapter
    from unirl.train import FSDPBackend

    lora = {"rank": 2, "alpha": 4, "targets": ["to_q", "to_k"], "extra_adapters": ["old"]}
    backend = FSDPBackend(
        bundle=SimpleNamespace(transformer=Toy(seed=0)),
        lora=lora,
        param_dtype="fp32",
        device="cpu",
        seed=0,
    )
    nudge(backend, 3)  # the trained adapter moves; "old" stays the copy made at injection
    old, trained = backend.adapter_state_dict("old"), backend.adapter_state_dict()
    assert any(not torch.equal(old[k], trained[k]) for k in old)

    def engine_adapter(engine: ToyEngine) -> dict[str, torch.Tensor]:
        return {
            strip_adapter(n, "default"): p.detach().clone()
            for n, p in engine.module.named_parameters()
            if ".lora_" in n
        }

    for source, want in (("old", old), (None, trained)):
        engine = ToyEngine()
        local_sync(LoraSync(source_adapter=source), backend, engine)
        got = engine_adapter(engine)
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[k], want[k]) for k in want), source
    with pytest.raises(
        ConfigError, match=r"source_adapter='ema2' is not an adapter.*\['default', 'old'\]"
    ):
        LoraSync(source_adapter="ema2").check_backend(backend)
    with pytest.raises(ConfigError, match="only a LoRA sync moves a named adapter"):
        FullSync(source_adapter="old")
