"""``@distributed`` and the dispatch modes: how a driver call fans out and gathers back.

Batch-like means duck-typed: ``x.chunk(n)``, ``type(x).concat(list)`` and ``len(x)``
(``unirl.types.Batch`` has all three). Tensors are never split: they are broadcast.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, Self, TypeGuard, TypeVar, overload

from unirl.config import require

F = TypeVar("F", bound=Callable[..., object])

SPEC_ATTR = "__unirl_distributed__"


class Dispatch(enum.Enum):
    """How a driver call reaches the workers of a role."""

    BROADCAST = "broadcast"  # same args to every rank; returns [result per rank]
    DP_SCATTER = "dp_scatter"  # split Batch/list args by dp rank; gather + concat
    RANK_ZERO = "rank_zero"  # role rank 0 only; returns its result


@dataclass(frozen=True, kw_only=True)
class DistributedSpec:
    """What ``@distributed`` records on a method."""

    dispatch: Dispatch = Dispatch.BROADCAST
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.dispatch, Dispatch),
            f"distributed(dispatch={self.dispatch!r}): use a unirl.distributed.group.Dispatch member",
        )
        require(
            self.timeout_s is None or self.timeout_s > 0,
            f"distributed(timeout_s={self.timeout_s!r}): must be > 0 or None (wait forever)",
        )


class BatchLike(Protocol):
    """What the dispatcher splits and merges (``unirl.types.Batch`` provides it)."""

    def __len__(self) -> int: ...

    def chunk(self, n: int) -> Sequence[Self]: ...

    @classmethod
    def concat(cls, parts: Sequence[Self]) -> Self: ...


@overload
def distributed(
    fn: F, *, dispatch: Dispatch = Dispatch.BROADCAST, timeout_s: float | None = None
) -> F: ...


@overload
def distributed(
    fn: None = None, *, dispatch: Dispatch = Dispatch.BROADCAST, timeout_s: float | None = None
) -> Callable[[F], F]: ...


def distributed(
    fn: F | None = None,
    *,
    dispatch: Dispatch = Dispatch.BROADCAST,
    timeout_s: float | None = None,
) -> F | Callable[[F], F]:
    """Mark a role method as driver-callable through a ``Handle``.

    Usable bare (``@distributed``) or with options
    (``@distributed(dispatch=Dispatch.DP_SCATTER, timeout_s=600)``). ``timeout_s`` overrides
    the pool's ``call_timeout_s`` for this method.
    """
    spec = DistributedSpec(dispatch=dispatch, timeout_s=timeout_s)

    def mark(method: F) -> F:
        require(callable(method), f"@distributed must decorate a method, got {method!r}")
        setattr(method, SPEC_ATTR, spec)
        return method

    return mark(fn) if fn is not None else mark


def collect_specs(cls: type) -> dict[str, DistributedSpec]:
    """``{method name: spec}`` for every ``@distributed`` method of ``cls`` (MRO-aware:
    an override without the decorator hides the base's mark)."""
    specs: dict[str, DistributedSpec] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, attr in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            target = attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr
            spec = getattr(target, SPEC_ATTR, None)
            if isinstance(spec, DistributedSpec):
                specs[name] = spec
    return specs


def is_batch_like(value: object) -> TypeGuard[BatchLike]:
    """True for objects the dispatcher may split and merge (see module docstring)."""
    if type(value).__module__.startswith("torch") or isinstance(value, str | bytes):
        return False
    return (
        callable(getattr(value, "chunk", None))
        and callable(getattr(type(value), "concat", None))
        and hasattr(value, "__len__")
    )


def _is_splittable(value: object) -> TypeGuard[list[object] | BatchLike]:
    return isinstance(value, list) or is_batch_like(value)


def _split_list(items: list[object], parts: int) -> list[object]:
    """``items`` cut into ``parts`` equal lists."""
    size = len(items) // parts
    return [items[i * size : (i + 1) * size] for i in range(parts)]


def scatter_args(
    args: Sequence[object], kwargs: dict[str, object], dp_size: int, *, role: str, method: str
) -> list[tuple[tuple[object, ...], dict[str, object]]]:
    """Split Batch-like and list arguments into ``dp_size`` equal parts, one per dp rank.

    Everything else is passed unchanged to every part. All split arguments must share one
    length divisible by ``dp_size``; the ValueError says which role and method.
    """
    splittable: dict[int | str, list[object] | BatchLike] = {
        i: a for i, a in enumerate(args) if _is_splittable(a)
    }
    splittable.update({k: v for k, v in kwargs.items() if _is_splittable(v)})
    lengths = {k: len(v) for k, v in splittable.items()}
    if len(set(lengths.values())) > 1:
        named = ", ".join(
            f"{'arg ' + str(k) if isinstance(k, int) else k}={n}" for k, n in lengths.items()
        )
        raise ValueError(
            f"cannot split arguments of different lengths ({named}) across data-parallel ranks "
            f"of role '{role}' (method {method}); pass batches of one size"
        )
    for n in lengths.values():
        if n % dp_size != 0:
            raise ValueError(
                f"cannot split batch of {n} across {dp_size} data-parallel ranks of role "
                f"'{role}' (method {method}); make batch divisible"
            )

    def parts_of(value: list[object] | BatchLike) -> list[object]:
        if isinstance(value, list):
            return _split_list(value, dp_size)
        parts: list[object] = list(value.chunk(dp_size))
        if len(parts) != dp_size:
            raise ValueError(
                f"{type(value).__name__}.chunk({dp_size}) returned {len(parts)} parts for role "
                f"'{role}' (method {method}); chunk(n) must return exactly n parts"
            )
        return parts

    split_args = {i: parts_of(v) for i, v in splittable.items() if isinstance(i, int)}
    split_kwargs = {k: parts_of(v) for k, v in splittable.items() if isinstance(k, str)}
    out = []
    for part in range(dp_size):
        part_args = tuple(split_args[i][part] if i in split_args else a for i, a in enumerate(args))
        part_kwargs = {
            k: split_kwargs[k][part] if k in split_kwargs else v for k, v in kwargs.items()
        }
        out.append((part_args, part_kwargs))
    return out


def gather_results(results: list[object]) -> object:
    """Merge per-dp-rank results (rank order): Batch -> ``concat``, list -> flattened,
    all None -> None, anything else -> the list of per-rank results."""
    if all(r is None for r in results):
        return None
    lists = [r for r in results if isinstance(r, list)]
    if len(lists) == len(results):
        return [item for r in lists for item in r]
    first = results[0]
    batches = [r for r in results if is_batch_like(r) and type(r) is type(first)]
    if is_batch_like(first) and len(batches) == len(results):
        return type(first).concat(batches)
    return results
