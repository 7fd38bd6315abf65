"""``Handle``: the driver's proxy for one role spread over a slab of workers.

``handle.method(*args)`` runs a ``@distributed`` method with its dispatch mode and blocks;
``handle.call_async("method", ...)`` returns a ``PendingCall`` to overlap work, and
``Handle.wait(p1, p2, ...)`` gathers several, surfacing the first failure as soon as it lands.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal, Protocol

import ray
import ray.exceptions as rex

from unirl.distributed.group.dispatch import (
    Dispatch,
    DistributedSpec,
    gather_results,
    scatter_args,
)
from unirl.distributed.group.errors import RemoteCallError, RoleFailure
from unirl.distributed.group.rank import RankInfo
from unirl.distributed.group.watchdog import OwedCall, PingedPool, Watchdog

# ray.get on an object ray.wait already reported ready should return at once; this bound
# only guards against a stuck object transfer.
_FETCH_TIMEOUT_S = 300.0


class _Unset(Enum):
    """The type of ``_UNSET``: no per-handle timeout override was given."""

    TOKEN = "unset"


_UNSET: Final = _Unset.TOKEN
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerPool(PingedPool, Protocol):
    """What a Handle needs from its pool (``pool.PoolBase`` provides it), besides what the
    stall watchdog pings: submit a Worker call, say where workers live, build process groups."""

    @property
    def node_ips(self) -> list[str]: ...

    @property
    def call_timeout_s(self) -> float | None: ...

    def submit(self, pool_rank: int, method: str, *args: object) -> ray.ObjectRef: ...

    def init_process_group(
        self, pool_ranks: tuple[int, ...], *, group_name: str, timeout_s: float | None = None
    ) -> None: ...


@dataclass(kw_only=True)
class RankCall:
    """One in-flight actor call: role rank, pool rank and its ObjectRef."""

    rank: int
    pool_rank: int
    ref: ray.ObjectRef


@dataclass(kw_only=True)
class PendingCall:
    """An issued call on one role; ``result()`` waits for it (see ``wait_all``)."""

    role: str
    method: str
    dispatch: Dispatch
    calls: list[RankCall]
    timeout_s: float | None
    node_ips: list[str]  # by pool rank, for messages
    gather_ranks: list[int] = field(default_factory=list)  # DP_SCATTER: dp leaders by dp rank
    started: float = field(default_factory=time.monotonic)
    pool: PingedPool | None = None  # whose workers the stall watchdog pings while we wait

    @property
    def refs(self) -> list[ray.ObjectRef]:
        """The raw ObjectRefs (role rank order) for code that wants Ray's own tools."""
        return [c.ref for c in self.calls]

    @property
    def deadline(self) -> float | None:
        return None if self.timeout_s is None else self.started + self.timeout_s

    def result(self) -> object:
        """Wait and return the combined result (raises ``RemoteCallError``)."""
        return wait_all([self])[0]

    def _where(self, call: RankCall) -> str:
        return (
            f"rank {call.rank} (pool rank {call.pool_rank}, node {self.node_ips[call.pool_rank]})"
        )

    def _fetch(self, index: int) -> object:
        call = self.calls[index]
        head = f"role '{self.role}' method '{self.method}' failed on {self._where(call)}"
        try:
            return ray.get(call.ref, timeout=_FETCH_TIMEOUT_S)
        except rex.RayTaskError as err:
            cause = err.cause
            if isinstance(cause, RoleFailure):
                what, tb = f"{cause.exc_type}: {cause.message}", cause.traceback_text
            else:  # raised by Ray/Worker plumbing rather than role code
                what, tb = f"{type(cause).__name__}: {cause}", _ANSI.sub("", str(err))
            raise RemoteCallError(
                f"{head}: {what}\n--- remote traceback (rank {call.rank}) ---\n{tb}",
                role=self.role,
                method=self.method,
                ranks=[call.rank],
                remote_traceback=tb,
            ) from err
        except rex.RayActorError as err:
            raise RemoteCallError(
                f"{head}: its worker process died or is unreachable "
                f"({type(err).__name__}: {err}). The pool cannot continue; shut it down.",
                role=self.role,
                method=self.method,
                ranks=[call.rank],
            ) from err
        except rex.GetTimeoutError as err:
            raise RemoteCallError(
                f"{head}: result transfer did not finish within {_FETCH_TIMEOUT_S:.0f} s",
                role=self.role,
                method=self.method,
                ranks=[call.rank],
            ) from err
        except rex.RayError as err:
            raise RemoteCallError(
                f"{head}: {type(err).__name__}: {err}",
                role=self.role,
                method=self.method,
                ranks=[call.rank],
            ) from err

    def _timeout_error(self, indices: list[int]) -> RemoteCallError:
        ranks = [self.calls[i].rank for i in indices]
        where = ", ".join(self._where(self.calls[i]) for i in indices)
        return RemoteCallError(
            f"role '{self.role}' method '{self.method}' timed out after {self.timeout_s:g} s on "
            f"rank(s) {ranks}: {where}. The call may still be running there (a hang such as a "
            "collective missing a peer, or a slow step): raise @distributed(timeout_s=...) / "
            "call_timeout_s (a recipe's top level, DevicePoolConfig) if it is just slow.",
            role=self.role,
            method=self.method,
            ranks=ranks,
        )

    def _combine(self, values: list[object]) -> object:
        if self.dispatch is Dispatch.RANK_ZERO:
            return values[0]
        if self.dispatch is Dispatch.BROADCAST:
            return values
        return gather_results([values[i] for i in self.gather_ranks])


def wait_all(pendings: list[PendingCall]) -> list[object]:
    """Wait for every call of every pending; returns combined results in order.

    Results are checked as they land, so a failing or dead rank raises at once even while
    its peers still run; a pending past its deadline raises a timeout error naming the
    ranks that have not answered; a worker that stalls (``watchdog.py``: no heartbeat, or
    far past its measured duration) raises ``StalledCallError`` naming it.
    """
    outstanding: dict[ray.ObjectRef, tuple[int, int]] = {}
    values: list[list[object]] = []
    for p_index, pending in enumerate(pendings):
        values.append([None] * len(pending.calls))
        for c_index, call in enumerate(pending.calls):
            outstanding[call.ref] = (p_index, c_index)
    watchdog = Watchdog()
    while outstanding:
        busy = busy_ranks(pendings, outstanding)
        watchdog.update(busy)
        now = time.monotonic()
        watchdog.send_due(now)
        active = {p for p, _ in outstanding.values()}
        deadlines = [d for p in active if (d := pendings[p].deadline) is not None]
        waits = [max(0.0, d - now) for d in deadlines]
        wake = watchdog.wake_in(now)
        wait_s = min([*waits, wake]) if wake is not None else min(waits, default=None)
        refs = [*outstanding, *watchdog.ping_refs()]
        ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
        if ready:  # everything else that has landed too, so pings are never read late
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in [r for r in ready if watchdog.owns(r)]:
            watchdog.answered(ref)
        for ref in [r for r in ready if r in outstanding]:
            p_index, c_index = outstanding.pop(ref)
            try:
                values[p_index][c_index] = pendings[p_index]._fetch(c_index)
            except RemoteCallError as err:
                _note_other_failures(err, pendings[p_index], outstanding, p_index)
                raise
        now = time.monotonic()
        for p_index in sorted(active):
            pending = pendings[p_index]
            if pending.deadline is not None and now >= pending.deadline:
                late = sorted(c for p, c in outstanding.values() if p == p_index)
                if late:
                    raise pending._timeout_error(late)
        stalled = watchdog.stalled(busy_ranks(pendings, outstanding), now)
        if stalled is not None:
            raise stalled
    return [p._combine(v) for p, v in zip(pendings, values)]


def busy_ranks(
    pendings: list[PendingCall], outstanding: dict[ray.ObjectRef, tuple[int, int]]
) -> dict[tuple[int, int], OwedCall]:
    """``(id(pool), pool_rank)`` -> the first outstanding call that worker owes, for pendings
    whose pool pings (``stall_policy.ping_interval_s`` set)."""
    busy: dict[tuple[int, int], OwedCall] = {}
    for p_index, c_index in outstanding.values():
        pending = pendings[p_index]
        pool = pending.pool
        if pool is None or pool.stall_policy.ping_interval_s is None:
            continue
        call = pending.calls[c_index]
        key = (id(pool), call.pool_rank)
        if key not in busy:
            busy[key] = OwedCall(
                role=pending.role,
                method=pending.method,
                rank=call.rank,
                pool_rank=call.pool_rank,
                node_ip=pending.node_ips[call.pool_rank],
                pool=pool,
            )
    return busy


def _note_other_failures(
    err: RemoteCallError,
    pending: PendingCall,
    outstanding: dict[ray.ObjectRef, tuple[int, int]],
    p_index: int,
) -> None:
    """Fetch the pending's other already-finished ranks; add failed ones to ``err``.

    Also keeps Ray from logging those errors as "unhandled" when the refs are dropped.
    """
    mine = [ref for ref, (p, _) in outstanding.items() if p == p_index]
    ready, _ = ray.wait(mine, num_returns=len(mine), timeout=0) if mine else ([], [])
    also = []
    for ref in ready:
        c_index = outstanding[ref][1]
        try:
            pending._fetch(c_index)
        except RemoteCallError:
            also.append(pending.calls[c_index].rank)
    if also:
        err.ranks.extend(also)
        err.args = (f"{err.args[0]}\n(also failed on rank(s) {also})",)


class Handle:
    """Driver-side proxy of role ``role`` on pool ranks ``pool_ranks``.

    Attribute access returns a blocking caller for each ``@distributed`` method; a role
    method whose name clashes with a Handle attribute is reachable as
    ``handle.call("name", ...)``.
    """

    def __init__(
        self,
        *,
        pool: WorkerPool,
        role: str,
        pool_ranks: tuple[int, ...],
        rank_infos: list[RankInfo],
        specs: dict[str, DistributedSpec],
        timeout_s: float | Literal[_Unset.TOKEN] | None = _UNSET,
    ) -> None:
        self._pool = pool
        self.role = role
        self.pool_ranks = tuple(pool_ranks)
        self.rank_infos = list(rank_infos)
        self._specs = dict(specs)
        self._timeout_override = timeout_s

    @property
    def world_size(self) -> int:
        return len(self.pool_ranks)

    @property
    def dp_size(self) -> int:
        return self.rank_infos[0].dp_size

    @property
    def methods(self) -> dict[str, DistributedSpec]:
        """The role's ``@distributed`` methods and their specs."""
        return dict(self._specs)

    def __repr__(self) -> str:
        return f"Handle(role={self.role!r}, pool_ranks={list(self.pool_ranks)})"

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        specs = self.__dict__.get("_specs", {})
        if method not in specs:
            raise AttributeError(
                f"role '{self.__dict__.get('role')}' has no @distributed method '{method}' "
                f"(driver-callable: {sorted(specs)}); mark it with "
                "@distributed(dispatch=...) in the role class"
            )

        def caller(*args: object, **kwargs: object) -> Any:
            return self.call_async(method, *args, **kwargs).result()

        caller.__name__ = method
        return caller

    def options(self, *, timeout_s: float | None) -> Handle:
        """A copy whose calls use ``timeout_s`` (``None``: wait forever) for every method."""
        return Handle(
            pool=self._pool,
            role=self.role,
            pool_ranks=self.pool_ranks,
            rank_infos=self.rank_infos,
            specs=self._specs,
            timeout_s=timeout_s,
        )

    def call(self, method: str, *args: object, **kwargs: object) -> Any:
        """Blocking call of ``method`` with its dispatch mode."""
        return self.call_async(method, *args, **kwargs).result()

    def call_async(self, method: str, *args: object, **kwargs: object) -> PendingCall:
        """Issue ``method`` on the role's workers now; returns a ``PendingCall``."""
        spec = self._specs.get(method)
        if spec is None:
            self.__getattr__(method)  # raises the explanatory AttributeError
            raise AssertionError("unreachable")
        # an explicit timeout replaces the measured stall bound (watchdog.py)
        bounded = self._timeout_override is _UNSET and spec.timeout_s is None
        if self._timeout_override is not _UNSET:
            timeout_s = self._timeout_override
        elif spec.timeout_s is not None:
            timeout_s = spec.timeout_s
        else:
            timeout_s = self._pool.call_timeout_s
        submit = self._pool.submit
        ranks = range(len(self.pool_ranks))
        gather_ranks: list[int] = []
        # (args, kwargs) per rank, or a Ray reference to them
        payloads: dict[int, tuple[tuple[object, ...], dict[str, object]] | ray.ObjectRef]
        if spec.dispatch is Dispatch.RANK_ZERO:
            payloads = {0: (args, kwargs)}
        elif spec.dispatch is Dispatch.BROADCAST:
            shared = ray.put((args, kwargs)) if len(ranks) > 1 else (args, kwargs)
            payloads = dict.fromkeys(ranks, shared)
        else:
            parts = scatter_args(args, kwargs, self.dp_size, role=self.role, method=method)
            members = [
                [r for r in ranks if self.rank_infos[r].dp_rank == d] for d in range(self.dp_size)
            ]
            shared_parts = [ray.put(p) if len(m) > 1 else p for p, m in zip(parts, members)]
            payloads = {r: shared_parts[self.rank_infos[r].dp_rank] for r in ranks}
            for dp_rank in range(self.dp_size):
                leaders = [r for r in members[dp_rank] if self.rank_infos[r].is_dp_leader]
                gather_ranks.append(leaders[0])
        calls = [
            RankCall(
                rank=r,
                pool_rank=self.pool_ranks[r],
                ref=submit(self.pool_ranks[r], "call", self.role, method, payload, bounded),
            )
            for r, payload in payloads.items()
        ]
        return PendingCall(
            role=self.role,
            method=method,
            dispatch=spec.dispatch,
            calls=calls,
            timeout_s=timeout_s,
            node_ips=self._pool.node_ips,
            gather_ranks=[[c.rank for c in calls].index(r) for r in gather_ranks],
            pool=self._pool,
        )

    def init_process_group(self, *, timeout_s: float | None = None) -> None:
        """Create the ``torch.distributed`` group over this role's workers.

        Initialises the pool-wide world group first if needed (every pool worker joins),
        then a subgroup over this slab unless it is the whole pool. Roles reach it through
        ``Remote.process_group`` / ``current_process_group()``.
        """
        self._pool.init_process_group(
            self.pool_ranks, group_name=f"role:{self.role}", timeout_s=timeout_s
        )

    @staticmethod
    def wait(*pending: PendingCall) -> list[Any]:
        """Results of several ``PendingCall``s, in argument order (first failure raises)."""
        return wait_all(list(pending))
