"""The ``tensor`` transport: buckets as self-describing bytes (round trip for mixed dtypes,
every corruption named), and a full sync into an engine copy through
``receive_tensor_buckets`` with the read-back equal to the sender's checksums."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from sync_fakes import ToyEngine, trainer

from unirl.config import ConfigError
from unirl.distributed.weight_sync import (
    FullSync,
    LoraSync,
    SyncSource,
    TensorMeta,
    WeightSyncError,
    compare_checksums,
    decode_bucket,
    encode_bucket,
    plan_buckets,
    tensor_checksum,
)
from unirl.distributed.weight_sync.tensor_wire import MAGIC


def _tensors() -> dict[str, torch.Tensor]:
    return {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 3,
        "b": torch.arange(5, dtype=torch.bfloat16) - 2,
        "c": torch.arange(4, dtype=torch.int64),
    }


def _entries(tensors: dict[str, torch.Tensor]) -> list[TensorMeta]:
    return [
        TensorMeta(
            name=n, source=n, shape=tuple(t.shape), dtype=str(t.dtype), wire_dtype=str(t.dtype)
        )
        for n, t in tensors.items()
    ]


def test_bucket_round_trip_keeps_bits_and_order() -> None:
    tensors = _tensors()
    buckets = plan_buckets(_entries(tensors), 64)  # a (24 B) + b (10 B), then c (32 B)
    assert [[s.name for s in b.slots] for b in buckets] == [["a", "b"], ["c"]]
    payloads = [encode_bucket(b, tensors, index=i, total=2) for i, b in enumerate(buckets)]
    assert all(p.startswith(MAGIC) for p in payloads)
    got = {}
    for i, p in enumerate(payloads):
        bucket = decode_bucket(p)
        assert (bucket.index, bucket.total) == (i, 2)
        got.update(bucket.tensors)
    assert list(got) == ["a", "b", "c"]
    for n, t in tensors.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t)
        assert tensor_checksum(got[n]) == tensor_checksum(t)


def test_corrupt_truncated_and_foreign_payloads_are_named() -> None:
    tensors = _tensors()
    (bucket,) = plan_buckets(_entries(tensors), 1 << 20)
    payload = encode_bucket(bucket, tensors, index=0, total=1)
    with pytest.raises(WeightSyncError, match=r"bucket 0 of 1 fails its SHA-256"):
        decode_bucket(payload[:-1] + bytes([payload[-1] ^ 1]))
    with pytest.raises(WeightSyncError, match=r"holds \d+ bytes, its header says"):
        decode_bucket(payload[:-16])
    with pytest.raises(WeightSyncError, match="not a unirl tensor bucket"):
        decode_bucket(b"PK\x03\x04" + payload[4:])
    # a header whose checksum disagrees with the bytes (a sender bug): named per tensor
    start = len(MAGIC) + 8
    (n,) = struct.unpack("<Q", payload[len(MAGIC) : start])
    header = json.loads(payload[start : start + n])
    header["tensors"][1]["checksum"] += 1
    head = json.dumps(header, sort_keys=True).encode()
    forged = MAGIC + struct.pack("<Q", len(head)) + head + payload[start + n :]
    with pytest.raises(WeightSyncError, match=r"b in bucket 0 reads back checksum"):
        decode_bucket(forged)


def test_full_sync_over_tensor_buckets_reads_back_equal() -> None:
    backend = trainer(lora=False)
    engine = ToyEngine(dtype=torch.bfloat16)
    sync = FullSync(transport="tensor", bucket_mb=0.0005)  # ~500 B: several buckets
    source = SyncSource(backend=backend, sync=sync)
    raw = source.manifest()
    manifest = raw.with_receiver_dtypes(engine.prepare_sync(raw), sync.wire_dtype)
    engine.prepare_sync(manifest)
    wire = source._wire(manifest)
    buckets = plan_buckets(manifest.entries, sync.bucket_bytes)
    assert len(buckets) >= 2
    boxes = [encode_bucket(b, wire, index=i, total=len(buckets)) for i, b in enumerate(buckets)]
    expected = source._expected(manifest, wire)
    from dataclasses import replace

    report = engine.receive_tensor_buckets(boxes, replace(manifest, expected=expected))
    compare_checksums(expected, report["checksums"], where="tensor transport")
    assert report["num_tensors"] == len(manifest.entries)
    with pytest.raises(WeightSyncError, match=r"got bucket 1 of \d+ as number 0"):
        engine.receive_tensor_buckets(boxes[1:] + boxes[:1], manifest)


def test_tensor_transport_in_any_layout() -> None:
    assert FullSync(transport="tensor").transport_for("separate") == "tensor"
    assert FullSync(transport="tensor").transport_for("colocate") == "tensor"
    assert LoraSync(transport="tensor").transport_for("separate") == "tensor"
    with pytest.raises(ConfigError, match=r"sync.transport must be one of .*'tensor'"):
        FullSync(transport="tensors")  # type: ignore[arg-type]
