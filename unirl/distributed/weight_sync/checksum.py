"""Bit-exact tensor checksums for read-back verification of weight syncs.

A checksum is computed from the tensor's *stored bits* (its dtype as held), folded with its
dtype and shape, so two tensors get the same checksum exactly when they hold the same bits.
The reduction is an int64 sum with wrap-around: integer addition is associative, so the
value does not depend on reduction order, device or thread count (CPU and CUDA agree).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

import torch

_MASK64 = (1 << 64) - 1
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_POSITION_MOD = 65_521  # a prime: position weights 1..65521 make transposes / swaps visible


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


@torch.no_grad()
def tensor_checksum(t: torch.Tensor) -> int:
    """Checksum of ``t``'s bits (dtype and shape included); a signed 64-bit Python int.

    Plain tensors only: gather a DTensor (``full_tensor()``) before calling.
    """
    flat = t.detach().contiguous().reshape(-1)
    header = zlib.crc32(f"{flat.dtype}|{tuple(t.shape)}".encode())
    if flat.numel() == 0:
        return _signed(header)
    if flat.dtype.is_complex:
        flat = torch.view_as_real(flat).reshape(-1)
    view = _INT_VIEW.get(flat.element_size())
    if view is None:
        raise TypeError(
            f"tensor_checksum: unsupported element size {flat.element_size()} ({flat.dtype})"
        )
    bits = flat.view(view).to(torch.int64)
    weights = torch.arange(flat.numel(), dtype=torch.int64, device=flat.device) % _POSITION_MOD + 1
    plain = int(bits.sum().item())
    weighted = int((bits * weights).sum().item())
    return _signed(header * 0x9E3779B97F4A7C15 + plain * 0xBF58476D1CE4E5B9 + weighted)


def expected_checksum(
    t: torch.Tensor, *, wire_dtype: torch.dtype, target_dtype: torch.dtype
) -> int:
    """What the receiver must read back after ``t`` travels as ``wire_dtype`` and is stored as
    ``target_dtype`` (the casts the sync performs, in that order)."""
    return tensor_checksum(t.detach().to(wire_dtype).to(target_dtype))


def checksums(
    named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> dict[str, int]:
    """``{name: tensor_checksum}`` for named tensors."""
    items = named.items() if isinstance(named, Mapping) else named
    return {name: tensor_checksum(t) for name, t in items}


def digest(per_tensor: Mapping[str, int]) -> float:
    """One number summarising a checksum table (order-independent), exact in a float64 metric."""
    total = 0
    for name, value in per_tensor.items():
        total += zlib.crc32(name.encode()) * 0x2545F4914F6CDD1D + value
    return float(total & ((1 << 52) - 1))
