"""What a sync moves (``SyncManifest``) and the fail-fast checks run before any byte moves.

The sender describes every tensor (engine name after ``name_remap``, trainer name, shape,
dtype, wire dtype); the receiver matches the manifest against its own parameter table and
raises ``WeightSyncError`` naming the offending tensors when a name, shape or dtype does not
line up, when nothing at all would be updated, or (LoRA) when some of its adapter tensors
would stay stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

_LISTED = 8


class WeightSyncError(RuntimeError):
    """A weight sync that cannot be applied or whose read-back does not match the sender."""


@dataclass(frozen=True, kw_only=True)
class TensorMeta:
    """One tensor of a sync: ``name`` on the engine, ``source`` on the trainer."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: str  # trainer-side dtype, e.g. "torch.float32"
    wire_dtype: str  # dtype on the wire ("" until the receiver's dtypes are known)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n


@dataclass(frozen=True, kw_only=True)
class SyncManifest:
    """Everything a receiver must know before bytes arrive.

    ``kind``: ``"lora"`` (adapter tensors) or ``"full"`` (trainable parameters).
    ``lora_config``: ``{"r", "lora_alpha", "target_modules", "adapter_name"}`` for LoRA.
    ``receiver_dtypes``: engine name -> dtype string, filled after ``prepare``.
    ``expected``: engine name -> checksum the receiver must read back (filled by the sender).
    """

    kind: str
    entries: tuple[TensorMeta, ...]
    lora_config: dict[str, Any] | None = None
    merged_lora: bool = False
    remap: str = "[] (identity)"
    receiver_dtypes: dict[str, str] = field(default_factory=dict)
    expected: dict[str, int] = field(default_factory=dict)
    version: int = 0

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def wire_bytes(self) -> int:
        return sum(e.numel * dtype_of(e.wire_dtype or e.dtype).itemsize for e in self.entries)

    def with_receiver_dtypes(
        self, dtypes: Mapping[str, str], wire_dtype: torch.dtype | None
    ) -> SyncManifest:
        """Fix each entry's wire dtype: ``wire_dtype`` if set, else the receiver's own dtype."""
        entries = tuple(
            replace(e, wire_dtype=str(wire_dtype) if wire_dtype is not None else dtypes[e.name])
            for e in self.entries
        )
        return replace(self, entries=entries, receiver_dtypes=dict(dtypes))


def dtype_of(name: str) -> torch.dtype:
    """``"torch.bfloat16"`` -> ``torch.bfloat16``."""
    value = getattr(torch, name.split(".")[-1], None)
    if not isinstance(value, torch.dtype):
        raise WeightSyncError(f"unknown dtype {name!r} in a sync manifest")
    return value


def _listed(items: list[str]) -> str:
    more = f", ... (+{len(items) - _LISTED} more)" if len(items) > _LISTED else ""
    return ", ".join(items[:_LISTED]) + more


def check_manifest(
    manifest: SyncManifest,
    table: Mapping[str, torch.Tensor],
    *,
    where: str,
    require_complete: bool,
) -> dict[str, str]:
    """Match ``manifest`` against the receiver's ``table`` (engine name -> tensor).

    Returns ``{engine name: receiver dtype}``. Raises ``WeightSyncError`` on unmatched names
    (naming them, their trainer names and some engine names), on zero matches, on shape
    mismatches, on a floating <-> non-floating dtype mismatch, and with
    ``require_complete`` when some table entries would not be updated.
    """
    entries = list(manifest.entries)
    seen: dict[str, str] = {}
    duplicates = []
    for e in entries:
        if e.name in seen:
            duplicates.append(f"{e.name} (from {seen[e.name]} and {e.source})")
        seen[e.name] = e.source
    if duplicates:
        raise WeightSyncError(
            f"{where}: sync.name_remap {manifest.remap} maps several trainer tensors onto one engine "
            f"tensor: {_listed(duplicates)}"
        )
    unmatched = [e for e in entries if e.name not in table]
    hint = (
        f"The engine's {manifest.kind} tensors are named like: {_listed(sorted(table)[:_LISTED])}; "
        f"fix sync.name_remap (now {manifest.remap})"
    )
    if not entries:
        raise WeightSyncError(
            f"{where}: the trainer offers zero tensors for a {manifest.kind} sync"
        )
    if len(unmatched) == len(entries):
        raise WeightSyncError(
            f"{where}: zero parameters would be updated: none of the {len(entries)} {manifest.kind} "
            f"tensors match an engine parameter. Unmatched parameters: "
            f"{_listed([f'{e.name} (trainer: {e.source})' for e in unmatched])}. {hint}"
        )
    if unmatched:
        raise WeightSyncError(
            f"{where}: {len(unmatched)} of {len(entries)} {manifest.kind} tensors match no engine "
            f"parameter. Unmatched parameters: "
            f"{_listed([f'{e.name} (trainer: {e.source})' for e in unmatched])}. {hint}"
        )
    shapes = [
        f"{e.name}: trainer {list(e.shape)} vs engine {list(table[e.name].shape)}"
        for e in entries
        if tuple(table[e.name].shape) != tuple(e.shape)
    ]
    if shapes:
        raise WeightSyncError(
            f"{where}: shape mismatch for {len(shapes)} tensor(s): {_listed(shapes)}"
        )
    dtypes = []
    for e in entries:
        mine = table[e.name].dtype
        theirs = dtype_of(e.dtype)
        wire = dtype_of(e.wire_dtype) if e.wire_dtype else None
        if mine.is_floating_point != theirs.is_floating_point or (
            wire is not None and wire.is_floating_point != mine.is_floating_point
        ):
            dtypes.append(f"{e.name}: trainer {theirs}, wire {wire}, engine {mine}")
    if dtypes:
        raise WeightSyncError(
            f"{where}: dtype mismatch (floating vs integer) for {len(dtypes)} tensor(s): {_listed(dtypes)}"
        )
    if require_complete:
        stale = sorted(set(table) - set(seen))
        if stale:
            raise WeightSyncError(
                f"{where}: {len(stale)} engine {manifest.kind} tensor(s) would never be updated (the "
                f"trainer does not send them): {_listed(stale)}; check the LoRA targets on both sides"
            )
    return {e.name: str(table[e.name].dtype) for e in entries}


def compare_checksums(
    expected: Mapping[str, int], actual: Mapping[str, int], *, where: str
) -> None:
    """Raise ``WeightSyncError`` naming tensors whose read-back checksum differs (or is missing)."""
    missing = sorted(set(expected) - set(actual))
    wrong = sorted(n for n in expected if n in actual and int(actual[n]) != int(expected[n]))
    if not expected:
        raise WeightSyncError(
            f"{where}: read-back verification has nothing to compare (zero tensors synced)"
        )
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} tensor(s) not read back: {_listed(missing)}")
        if wrong:
            parts.append(f"{len(wrong)} tensor(s) differ from the trainer's: {_listed(wrong)}")
        raise WeightSyncError(
            f"{where}: read-back checksums do not match the sender's; " + "; ".join(parts)
        )
