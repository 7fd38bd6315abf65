"""Worker-side view of a role: its RankInfo and process group, for code running in a Worker.

A role is any object a ``Worker`` builds (plain classes work). Deriving from ``Remote`` adds
``self.rank_info`` / ``self.process_group`` / ``self.role_name``; plain classes can call
``current_rank_info()`` / ``current_process_group()`` from ``__init__`` or a method.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from unirl.distributed.group.rank import RankInfo

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

ROLE_ATTR = "_unirl_role_context"

# what a role is built from: a Hydra mapping with ``_target_`` or a class / factory
RoleSpec: TypeAlias = Mapping[str, object] | Callable[..., object]


class HostWorker(Protocol):
    """What role code needs from the Worker hosting it (``worker.Worker`` provides it)."""

    def process_group_for(self, pool_ranks: tuple[int, ...]) -> ProcessGroup:
        """The ``torch.distributed`` group over ``pool_ranks`` (WORLD for the whole pool)."""
        ...


@dataclass(frozen=True, kw_only=True)
class RoleContext:
    """Who a role instance is: its name, slab RankInfo and the pool ranks of its slab."""

    name: str
    rank_info: RankInfo
    pool_ranks: tuple[int, ...]


_CURRENT_ROLE: contextvars.ContextVar[RoleContext | None] = contextvars.ContextVar(
    "unirl_current_role", default=None
)
_WORKER: HostWorker | None = None


def set_worker(worker: HostWorker) -> None:
    """Register the process's Worker (one per Ray actor process)."""
    global _WORKER
    _WORKER = worker


def current_worker() -> HostWorker:
    """The Worker hosting this process; raises outside a DevicePool worker."""
    if _WORKER is None:
        raise RuntimeError(
            "no unirl Worker in this process: current_worker()/current_rank_info() only work "
            "inside roles created with remote(...) in a placement block"
        )
    return _WORKER


@contextlib.contextmanager
def role_scope(context: RoleContext) -> Iterator[None]:
    """Make ``context`` current while a role is constructed or one of its methods runs."""
    token = _CURRENT_ROLE.set(context)
    try:
        yield
    finally:
        _CURRENT_ROLE.reset(token)


def current_role() -> RoleContext:
    """The role whose constructor or method is running now."""
    context = _CURRENT_ROLE.get()
    if context is None:
        raise RuntimeError(
            "no role is running: current_role()/current_rank_info() are only valid inside a "
            "role's __init__ or a method called through its Handle"
        )
    return context


def current_rank_info() -> RankInfo:
    """Slab RankInfo of the running role (rank, dp/tp/... within the role's workers)."""
    return current_role().rank_info


def current_process_group() -> ProcessGroup:
    """``torch.distributed`` group spanning the running role's workers.

    Exists once the driver called ``handle.init_process_group()``; ``dist.group.WORLD`` when
    the role covers the whole pool.
    """
    return current_worker().process_group_for(current_role().pool_ranks)


class Remote:
    """Optional base class for roles: exposes the role's rank, name and process group."""

    def _role_context(self) -> RoleContext:
        context = self.__dict__.get(ROLE_ATTR)
        return context if context is not None else current_role()

    @property
    def role_name(self) -> str:
        return self._role_context().name

    @property
    def rank_info(self) -> RankInfo:
        return self._role_context().rank_info

    @property
    def process_group(self) -> ProcessGroup:
        return current_worker().process_group_for(self._role_context().pool_ranks)
