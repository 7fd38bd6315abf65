"""Byte buckets for collective transfers: many tensors, few broadcasts.

Tensors (already in their wire dtype) are packed back to back into ``uint8`` buffers of at
most ``bucket_bytes`` (a single larger tensor gets a bucket of its own), each slot aligned to
16 bytes so it can be viewed back as its dtype without a copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from unirl.distributed.weight_sync.manifest import TensorMeta, dtype_of

ALIGN = 16


@dataclass(frozen=True, kw_only=True)
class Slot:
    name: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True, kw_only=True)
class Bucket:
    slots: tuple[Slot, ...]
    nbytes: int


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(
    entries: list[TensorMeta] | tuple[TensorMeta, ...], bucket_bytes: int
) -> list[Bucket]:
    """Buckets in manifest order; every entry must have its ``wire_dtype`` set."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be >= {ALIGN}, got {bucket_bytes}")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    cursor = 0
    for e in entries:
        dtype = dtype_of(e.wire_dtype)
        nbytes = e.numel * dtype.itemsize
        if slots and cursor + nbytes > bucket_bytes:
            buckets.append(Bucket(slots=tuple(slots), nbytes=cursor))
            slots, cursor = [], 0
        slots.append(
            Slot(name=e.name, offset=cursor, nbytes=nbytes, shape=tuple(e.shape), dtype=dtype)
        )
        cursor = _aligned(cursor + nbytes)
    if slots:
        buckets.append(Bucket(slots=tuple(slots), nbytes=cursor))
    return buckets


def pack(bucket: Bucket, tensors: Mapping[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """One ``uint8[bucket.nbytes]`` buffer on ``device`` holding the bucket's tensors."""
    buf = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=device)
    for slot in bucket.slots:
        t = tensors[slot.name]
        if t.dtype != slot.dtype or tuple(t.shape) != slot.shape:
            raise ValueError(
                f"pack: {slot.name} is {t.dtype}{list(t.shape)}, the plan says {slot.dtype}{list(slot.shape)}"
            )
        buf[slot.offset : slot.offset + slot.nbytes].copy_(
            t.detach().contiguous().reshape(-1).view(torch.uint8)
        )
    return buf


def unpack(bucket: Bucket, buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of ``buf`` as the bucket's tensors (valid while ``buf`` lives)."""
    return {
        slot.name: buf[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)
        for slot in bucket.slots
    }
