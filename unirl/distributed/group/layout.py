"""``placement()`` blocks claim slabs of a pool; ``remote()`` builds a role on every worker
of the innermost block.

Slab arithmetic: a block claims ``devices`` (or ``fraction`` x the enclosing slab) contiguous
workers, starting where the previous block under the same parent stopped. Two top-level
blocks of 0.5 / 0.5 are disjoint (the ``separate`` layout); a block that no longer fits
starts again at the parent's first worker and so colocates with earlier blocks
(``shared_workers=True``), or raises (``shared_workers=False``). A block opened with
``shared_workers=False`` is exclusive: later blocks may not wrap onto it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from unirl.config import require
from unirl.distributed.group.handle import Handle
from unirl.distributed.group.rank import ParallelSizes
from unirl.distributed.group.role import RoleSpec


class PlacementPool(Protocol):
    """What ``placement()`` and ``remote()`` need from a pool (``pool.PoolBase`` provides
    it): its whole slab, its roles, and a way to build a role on a slab."""

    @property
    def root_slab(self) -> Slab: ...

    @property
    def roles(self) -> dict[str, Handle]: ...

    def unique_role_name(self, base: str) -> str: ...

    def create_role(
        self,
        name: str,
        spec: RoleSpec,
        kwargs: dict[str, object],
        siblings: dict[str, str],
        pool_ranks: tuple[int, ...],
        parallel: ParallelSizes,
    ) -> Handle: ...


@dataclass(kw_only=True)
class Slab:
    """A contiguous run of pool ranks claimed by a placement block."""

    pool: PlacementPool
    ranks: tuple[int, ...]
    exclusive: bool = False
    cursor: int = 0  # next free offset for child blocks
    claims: list[tuple[int, int, bool]] = field(default_factory=list)  # (start, stop, exclusive)

    def claim(self, count: int, *, shared_workers: bool) -> Slab:
        """Carve a child slab of ``count`` workers (see module docstring)."""
        size = len(self.ranks)
        require(
            1 <= count <= size,
            f"placement asks for {count} device(s) but the enclosing slab has {size} "
            f"(pool ranks {list(self.ranks)}); use a fraction in (0, 1] or devices <= {size}",
        )
        start = self.cursor
        if start + count > size:
            require(
                shared_workers,
                f"placement asks for {count} device(s) but only {size - start} of {size} in pool "
                f"ranks {list(self.ranks)} are unclaimed; pass shared_workers=True to colocate "
                "with earlier blocks, or shrink the fractions",
            )
            start = 0
        stop = start + count
        for c_start, c_stop, c_exclusive in self.claims:
            overlaps = start < c_stop and c_start < stop
            require(
                not (overlaps and (c_exclusive or not shared_workers)),
                f"placement of {count} device(s) at pool ranks {list(self.ranks[start:stop])} "
                f"overlaps an earlier block on pool ranks {list(self.ranks[c_start:c_stop])} "
                "and one of them was opened with shared_workers=False",
            )
        self.claims.append((start, stop, not shared_workers))
        self.cursor = stop
        return Slab(pool=self.pool, ranks=self.ranks[start:stop], exclusive=not shared_workers)


_STACK: contextvars.ContextVar[tuple[Slab, ...]] = contextvars.ContextVar(
    "unirl_placement_stack", default=()
)


@contextlib.contextmanager
def placement(
    pool: PlacementPool,
    fraction: float = 1.0,
    *,
    devices: int | None = None,
    shared_workers: bool = True,
) -> Iterator[Slab]:
    """Claim a slab of ``pool``: ``devices`` workers, or ``fraction`` of the enclosing slab
    (the whole pool at top level). Nested blocks on the same pool claim sub-slabs."""
    parent = next((s for s in reversed(_STACK.get()) if s.pool is pool), pool.root_slab)
    size = len(parent.ranks)
    if devices is None:
        require(
            0.0 < fraction <= 1.0,
            f"placement(fraction={fraction}): must be in (0, 1]",
        )
        exact = fraction * size
        count = round(exact)
        require(
            abs(exact - count) < 1e-6 and count >= 1,
            f"placement(fraction={fraction}) of a {size}-device slab is {exact:g} devices; "
            "choose a fraction that gives a whole number, or pass devices=",
        )
    else:
        require(
            fraction == 1.0,
            "placement: pass either fraction or devices, not both",
        )
        count = devices
    slab = parent.claim(count, shared_workers=shared_workers)
    token = _STACK.set((*_STACK.get(), slab))
    try:
        yield slab
    finally:
        _STACK.reset(token)


def current_slab() -> Slab:
    """The innermost active placement block; raises outside one."""
    stack = _STACK.get()
    if not stack:
        raise RuntimeError(
            "remote() must be called inside `with placement(pool, ...):` so it knows which "
            "workers to use"
        )
    return stack[-1]


def _default_name(spec: RoleSpec) -> str:
    if isinstance(spec, Mapping):
        return str(spec["_target_"]).rsplit(".", 1)[-1]
    return getattr(spec, "__name__", type(spec).__name__)


def remote(
    cfg_or_cls: RoleSpec,
    *,
    name: str | None = None,
    parallel: ParallelSizes | None = None,
    **kwargs: object,
) -> Handle:
    """Create a role on every worker of the current placement block; returns its Handle.

    ``cfg_or_cls`` is a Hydra-style mapping with ``_target_`` (DictConfig accepted) or a
    class / factory. Keyword arguments that are Handles resolve, on each worker, to that
    worker's instance of the sibling role (it must live on every worker of this block);
    other keyword arguments are passed as they are. ``parallel`` sets tp/pp/sp/ep sizes
    (dp is the rest of the slab).
    """
    slab = current_slab()
    pool = slab.pool
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg_or_cls):  # DictConfig -> plain resolved dict for pickling
        cfg_or_cls = OmegaConf.to_container(cfg_or_cls, resolve=True)  # type: ignore[assignment]
    if isinstance(cfg_or_cls, Mapping):
        cfg_or_cls = dict(cfg_or_cls)
        require(
            "_target_" in cfg_or_cls,
            f"remote(): config mapping needs a '_target_' key, got keys {sorted(cfg_or_cls)}",
        )
    else:
        require(
            callable(cfg_or_cls),
            f"remote(): expected a config mapping or a class, got {cfg_or_cls!r}",
        )
    role = name or pool.unique_role_name(_default_name(cfg_or_cls))
    require(
        role not in pool.roles,
        f"remote(name={role!r}): a role with this name already exists in the pool",
    )
    siblings: dict[str, str] = {}
    plain: dict[str, object] = {}
    for key, value in kwargs.items():
        if isinstance(value, Handle):
            require(
                value._pool is pool,
                f"remote({role!r}): sibling '{key}' (role '{value.role}') belongs to another pool",
            )
            missing = sorted(set(slab.ranks) - set(value.pool_ranks))
            require(
                not missing,
                f"sibling '{key}' (role '{value.role}') lives on pool ranks {list(value.pool_ranks)} "
                f"but role '{role}' is placed on pool ranks {list(slab.ranks)} (missing there: "
                f"{missing}); create both inside the same placement block",
            )
            siblings[key] = value.role
        else:
            plain[key] = value
    return pool.create_role(
        role, cfg_or_cls, plain, siblings, slab.ranks, parallel or ParallelSizes()
    )
