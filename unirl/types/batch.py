"""``Batch``: one dataclass base whose fields carry a kind, so any contract can be split and merged.

Field kinds (declared with :func:`batch_field`):

- ``concat``: per-sample values on dim 0 — tensors, lists, nested ``Batch`` or dicts of those.
- ``shared``: one value for every sample (sampling params, σ schedule); must agree on concat.
- ``packed``: variable-length rows in a :class:`Packed` (values packed on dim 0 plus offsets).
- ``max`` / ``sum`` / ``mean``: scalars or dicts of scalars (timings, counters), reduced on concat
  and copied unchanged on split.

From these kinds alone ``Batch`` derives ``concat``, ``split``, ``chunk``, ``select``,
``repeat_interleave`` and ``to`` for every subclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, Self, TypeVar

import torch

FieldKind = Literal["concat", "shared", "packed", "max", "sum", "mean"]
_REDUCE_KINDS = ("max", "sum", "mean")
_KINDS = ("concat", "shared", "packed", *_REDUCE_KINDS)


def batch_field(kind: FieldKind = "concat", **kwargs: Any) -> Any:
    """A dataclass field tagged with its batch kind; ``kwargs`` go to ``dataclasses.field``."""
    if kind not in _KINDS:
        raise ValueError(f"batch_field kind must be one of {_KINDS}, got {kind!r}")
    metadata = dict(kwargs.pop("metadata", {}) or {})
    metadata["batch_kind"] = kind
    return dataclasses.field(metadata=metadata, **kwargs)


@dataclasses.dataclass
class Packed:
    """Variable-length rows packed on dim 0: row ``i`` is ``values[offsets[i]:offsets[i+1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor  # LongTensor[N + 1], offsets[0] == 0

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or self.offsets.numel() < 1 or int(self.offsets[0]) != 0:
            raise ValueError("Packed.offsets must be a 1-d LongTensor starting at 0")
        if int(self.offsets[-1]) != self.values.shape[0]:
            raise ValueError(
                f"Packed.offsets ends at {int(self.offsets[-1])} but values has "
                f"{self.values.shape[0]} rows"
            )

    @classmethod
    def from_list(cls, rows: Sequence[torch.Tensor]) -> Packed:
        lengths = torch.tensor([r.shape[0] for r in rows], dtype=torch.long)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        values = torch.cat(list(rows), 0) if rows else torch.empty(0)
        return cls(values=values, offsets=offsets)

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, i: int) -> torch.Tensor:
        return self.values[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def to_list(self) -> list[torch.Tensor]:
        return [self.row(i) for i in range(len(self))]

    def select(self, indices: Sequence[int]) -> Packed:
        return (
            Packed.from_list([self.row(int(i)) for i in indices])
            if len(indices)
            else (Packed(values=self.values[:0], offsets=torch.zeros(1, dtype=torch.long)))
        )

    @staticmethod
    def concat(items: Sequence[Packed]) -> Packed:
        values = torch.cat([p.values for p in items], 0)
        parts, base = [torch.zeros(1, dtype=torch.long)], 0
        for p in items:
            parts.append(p.offsets[1:] + base)
            base += int(p.offsets[-1])
        return Packed(values=values, offsets=torch.cat(parts))

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Packed:
        return Packed(values=fn(self.values), offsets=self.offsets)


# --- per-value helpers for ``concat`` fields ------------------------------------------------


def _value_len(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return int(value.shape[0])
    if isinstance(value, Batch | Packed | list | tuple):
        return len(value)
    if isinstance(value, dict):
        lens = {_value_len(v) for v in value.values()} - {None}
        return lens.pop() if len(lens) == 1 else None
    raise TypeError(f"unsupported per-sample value of type {type(value).__name__}")


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a CPU tensor bound for CUDA goes through pinned memory with a
    non-blocking copy, so small index / σ tensors in a hot loop never stall the host on the
    device queue (a pageable host-to-device copy synchronises the stream)."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _select(value: object, index: torch.Tensor) -> object:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.index_select(0, host_to_device(index, value.device))
    if isinstance(value, Batch):
        return value.select(index)
    if isinstance(value, Packed):
        return value.select(index.tolist())
    if isinstance(value, list | tuple):
        return type(value)(value[i] for i in index.tolist())
    if isinstance(value, dict):
        return {k: _select(v, index) for k, v in value.items()}
    raise TypeError(f"cannot select from {type(value).__name__}")


_V = TypeVar("_V")


def _all_of(name: str, values: list[object], kind: type[_V]) -> list[_V]:
    """``values`` when every one is a ``kind`` (the first part's type); else a TypeError."""
    same = [v for v in values if isinstance(v, kind)]
    if len(same) != len(values):
        raise _mixed(name, values)
    return same


def _mixed(name: str, values: list[object]) -> TypeError:
    found = sorted({type(v).__name__ for v in values})
    return TypeError(f"field {name!r}: parts hold different types ({found}); cannot concat")


def _concat(name: str, values: list[object]) -> object:
    present = [v is not None for v in values]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"field {name!r} is None in some parts and set in others")
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(_all_of(name, values, torch.Tensor), 0)
    if isinstance(first, Batch):
        return type(first).concat(_all_of(name, values, type(first)))
    if isinstance(first, Packed):
        return Packed.concat(_all_of(name, values, Packed))
    if isinstance(first, list | tuple):
        out: list[object] = []
        for part in values:
            if not isinstance(part, list | tuple):
                raise _mixed(name, values)
            out.extend(part)
        return type(first)(out)
    if isinstance(first, dict):
        keys = list(first)
        dicts = _all_of(name, values, dict)
        for v in dicts[1:]:
            if list(v) != keys:
                raise ValueError(
                    f"field {name!r}: dict keys differ across parts ({keys} vs {list(v)})"
                )
        return {k: _concat(f"{name}.{k}", [v[k] for v in dicts]) for k in keys}
    raise TypeError(f"field {name!r}: cannot concat values of type {type(first).__name__}")


def _map_tensors(value: object, fn: Callable[[torch.Tensor], torch.Tensor]) -> object:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Batch):
        return value._map(fn)
    if isinstance(value, Packed):
        return value.map(fn)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map_tensors(v, fn) for v in value)
    return value


def _shared_equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and bool(torch.equal(a.cpu(), b.cpu()))
        )
    try:
        return bool(a == b)
    except Exception:  # objects without a usable __eq__
        return a is b


def _reduce(kind: str, values: list[Any]) -> Any:
    if all(v is None for v in values):
        return None
    values = [v for v in values if v is not None]
    if isinstance(values[0], dict):
        keys: list[str] = []
        for v in values:
            keys.extend(k for k in v if k not in keys)
        return {k: _reduce(kind, [v[k] for v in values if k in v]) for k in keys}
    if kind == "max":
        return max(values)
    if kind == "sum":
        return sum(values)
    return sum(values) / len(values)


class Batch:
    """Base for every batch-like contract; subclasses are ``@dataclass(kw_only=True)``.

    ``len(batch)`` is the number of samples, read from the first non-empty concat or packed
    field; every such field must agree (checked by :meth:`validate_lengths`).
    ``host_fields`` names small metadata tensors that :meth:`to` leaves on the host.
    """

    host_fields: ClassVar[tuple[str, ...]] = ()
    # every subclass is a dataclass: declared so that type checkers accept ``Self`` in
    # ``dataclasses.fields`` / ``dataclasses.replace``
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    # -- introspection -----------------------------------------------------------------

    @classmethod
    def field_kinds(cls) -> dict[str, str]:
        return {
            f.name: f.metadata.get("batch_kind", "concat")
            for f in dataclasses.fields(cls)
            if f.init
        }

    def _per_sample_items(self) -> list[tuple[str, object]]:
        return [
            (name, getattr(self, name))
            for name, kind in self.field_kinds().items()
            if kind in ("concat", "packed") and getattr(self, name) is not None
        ]

    def __len__(self) -> int:
        for _, value in self._per_sample_items():
            n = _value_len(value)
            if n is not None:
                return n
        return 0

    def validate_lengths(self) -> None:
        """Raise ``ValueError`` naming the field if per-sample fields disagree on length."""
        lengths = {name: _value_len(v) for name, v in self._per_sample_items()}
        lengths = {k: v for k, v in lengths.items() if v is not None}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"{type(self).__name__}: per-sample fields disagree on length: {lengths}"
            )

    # -- split / merge -------------------------------------------------------------------

    def _rebuild(self, per_sample: Callable[[str, object], object]) -> Self:
        kwargs = {}
        for name, kind in self.field_kinds().items():
            value = getattr(self, name)
            kwargs[name] = per_sample(name, value) if kind in ("concat", "packed") else value
        return dataclasses.replace(self, **kwargs)

    def select(self, indices: Sequence[int] | torch.Tensor) -> Self:
        """Samples at ``indices`` (any order, repeats allowed); shared and reduce fields kept."""
        index = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        n = len(self)
        if index.numel() and (int(index.min()) < -n or int(index.max()) >= n):
            raise IndexError(f"{type(self).__name__}.select: index out of range for {n} samples")
        index = torch.where(index < 0, index + n, index)
        return self._rebuild(lambda _, v: _select(v, index))

    def split(self, sizes: Sequence[int]) -> list[Self]:
        """Consecutive parts of the given sizes (they must sum to ``len(self)``)."""
        if sum(sizes) != len(self) or any(s < 0 for s in sizes):
            raise ValueError(
                f"{type(self).__name__}.split: sizes {list(sizes)} do not add up to {len(self)} samples"
            )
        parts, start = [], 0
        for size in sizes:
            parts.append(self.select(torch.arange(start, start + size)))
            start += size
        return parts

    def chunk(self, n: int) -> list[Self]:
        """``n`` equal consecutive parts; raises ``ValueError`` when ``len`` is not divisible."""
        total = len(self)
        if n <= 0 or total % n != 0:
            raise ValueError(
                f"cannot split a {type(self).__name__} of {total} samples into {n} equal parts; "
                f"make the batch size a multiple of {n}"
            )
        return self.split([total // n] * n)

    def repeat_interleave(self, repeats: int) -> Self:
        """Each sample repeated ``repeats`` times in place (a prompt expanded to its group)."""
        index = torch.arange(len(self)).repeat_interleave(repeats)
        return self.select(index)

    @classmethod
    def concat(cls, batches: Sequence[Self]) -> Self:
        """Inverse of :meth:`split`: per-sample fields concatenated, shared fields checked equal."""
        if not batches:
            raise ValueError(f"{cls.__name__}.concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        kwargs = {}
        for name, kind in first.field_kinds().items():
            values = [getattr(b, name) for b in batches]
            if kind in ("concat", "packed"):
                kwargs[name] = _concat(name, values)
            elif kind == "shared":
                for v in values[1:]:
                    if not _shared_equal(values[0], v):
                        raise ValueError(
                            f"{cls.__name__}.concat: shared field {name!r} differs between parts"
                        )
                kwargs[name] = values[0]
            else:
                kwargs[name] = _reduce(kind, values)
        return dataclasses.replace(first, **kwargs)

    # -- device / dtype ---------------------------------------------------------------------

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Self:
        kwargs = {name: _map_tensors(getattr(self, name), fn) for name in self.field_kinds()}
        return dataclasses.replace(self, **kwargs)

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Self:
        """Move every tensor to ``device``; ``dtype`` casts floating-point tensors only.
        Fields named in ``host_fields`` stay as they are."""

        def move(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=dtype)
            return t.to(device=device) if device is not None else t

        kwargs = {
            name: _map_tensors(getattr(self, name), move)
            for name in self.field_kinds()
            if name not in self.host_fields
        }
        return dataclasses.replace(self, **kwargs)
