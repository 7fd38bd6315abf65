"""The ``tensor`` transport's wire format: a bucket of tensors as one self-describing,
checksummed byte string.

For engines that hold their weights behind an API (an SGLang server, vLLM-Omni's workers)
on nodes the trainer shares no NCCL group with: trainer rank 0 packs the buckets of
``bucket.plan_buckets`` (the layout the collective transport broadcasts), turns each into
bytes with :func:`encode_bucket`, and the engine decodes them with :func:`decode_bucket` and
forwards them through its own HTTP / RPC API, bucket by bucket.

Layout of one bucket::

    b"UNIRLTB1" | uint64 LE header length | header (JSON, UTF-8) | data (bucket.nbytes)

The header holds the bucket's index and count, the SHA-256 of ``data`` and per tensor its
name, offset, byte length, shape, dtype and :func:`tensor_checksum`. Decoding checks the
magic, the lengths, the digest and every tensor's checksum, and raises ``WeightSyncError``
naming what does not match.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from unirl.distributed.weight_sync.bucket import Bucket, Slot, pack, unpack
from unirl.distributed.weight_sync.checksum import tensor_checksum
from unirl.distributed.weight_sync.manifest import WeightSyncError, dtype_of

MAGIC = b"UNIRLTB1"
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True, kw_only=True)
class DecodedBucket:
    """One bucket's tensors (CPU views of one buffer) and where it sits in the sync."""

    index: int
    total: int
    tensors: dict[str, torch.Tensor]
    nbytes: int


def encode_bucket(
    bucket: Bucket, wire: Mapping[str, torch.Tensor], *, index: int, total: int
) -> bytes:
    """``wire`` (tensors already in their wire dtype) packed as ``bucket`` plans, with header."""
    data = pack(bucket, wire, torch.device("cpu"))
    raw = data.numpy().tobytes()
    header = {
        "index": index,
        "total": total,
        "nbytes": bucket.nbytes,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "tensors": [
            {
                "name": s.name,
                "offset": s.offset,
                "nbytes": s.nbytes,
                "shape": list(s.shape),
                "dtype": str(s.dtype),
                "checksum": tensor_checksum(wire[s.name].detach().cpu()),
            }
            for s in bucket.slots
        ],
    }
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head + raw


def decode_bucket(payload: bytes | bytearray | memoryview) -> DecodedBucket:
    """The tensors of one encoded bucket, each verified against its checksum."""
    view = memoryview(payload)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise WeightSyncError(
            f"tensor transport: payload starts with {bytes(view[:8])!r}, not {MAGIC!r} (not a "
            "unirl tensor bucket, or a different format version)"
        )
    start = len(MAGIC) + _LENGTH.size
    (head_len,) = _LENGTH.unpack(view[len(MAGIC) : start])
    header = json.loads(bytes(view[start : start + head_len]))
    raw = bytes(view[start + head_len :])
    if len(raw) != header["nbytes"]:
        raise WeightSyncError(
            f"tensor transport: bucket {header['index']} holds {len(raw)} bytes, its header says "
            f"{header['nbytes']} (truncated in transit?)"
        )
    if hashlib.sha256(raw).hexdigest() != header["sha256"]:
        raise WeightSyncError(
            f"tensor transport: bucket {header['index']} of {header['total']} fails its SHA-256 "
            "(corrupted in transit)"
        )
    slots = tuple(
        Slot(
            name=t["name"],
            offset=int(t["offset"]),
            nbytes=int(t["nbytes"]),
            shape=tuple(int(s) for s in t["shape"]),
            dtype=dtype_of(t["dtype"]),
        )
        for t in header["tensors"]
    )
    buf = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    tensors = unpack(Bucket(slots=slots, nbytes=len(raw)), buf)
    for t in header["tensors"]:
        got = tensor_checksum(tensors[t["name"]])
        if got != t["checksum"]:
            raise WeightSyncError(
                f"tensor transport: {t['name']} in bucket {header['index']} reads back checksum "
                f"{got}, the sender's was {t['checksum']}"
            )
    return DecodedBucket(
        index=int(header["index"]), total=int(header["total"]), tensors=tensors, nbytes=len(raw)
    )


__all__ = ["MAGIC", "DecodedBucket", "decode_bucket", "encode_bucket"]
