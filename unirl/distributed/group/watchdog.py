"""Stall watchdog: a frozen or hung rank fails the call instead of holding the run.

While ``wait_all`` waits, the driver pings every worker that owes it a result. The ping
(``Worker.heartbeat``) runs in the actor's second Ray concurrency group, on its own
thread, so a long role call does not delay the answer; a stopped process answers nothing.
Two bounds come from the answers:

- **heartbeat**: a worker whose oldest unanswered ping is ``heartbeat_timeout_s`` old is
  frozen (SIGSTOP, a native call holding the GIL, swap, D-state) or its node is
  unreachable. Pings go out every ``ping_interval_s`` (``min(5, heartbeat_timeout_s / 4)``),
  so a freeze is named within ``heartbeat_timeout_s + ping_interval_s``.
- **measured**: each worker records the longest run of every role method; a call running
  longer than ``max(stall_floor_s, stall_factor x that longest earlier run)`` on that worker
  is hung in a live process (a deadlock, a collective missing a peer). The first run of a
  method has no such bound (it includes model load and compilation), and a call with an
  explicit ``timeout_s`` (``@distributed`` or ``handle.options``) uses that instead. Noticed
  at the first ping answer past the bound: within ``ping_interval_s`` of it.

The call's own timeout (``call_timeout_s``) still applies on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import ray
import ray.exceptions as rex

from unirl.config.pool import StallConfig, fields_of
from unirl.distributed.group.errors import StalledCallError

# Ray concurrency group of Worker.heartbeat (one thread, next to the role calls' thread).
HEARTBEAT_GROUP = "heartbeat"
_MAX_PING_INTERVAL_S = 5.0


@dataclass(kw_only=True)
class StallPolicy(StallConfig):
    """When the driver declares a busy rank stalled (see the module docstring): the bounds
    of :class:`~unirl.config.pool.StallConfig` (a pool's, :meth:`of`) and their arithmetic.

    ``heartbeat_timeout_s=None`` turns the heartbeat bound off, ``stall_factor=None`` the
    measured one; with both off no pings are sent.
    """

    @classmethod
    def of(cls, config: StallConfig) -> StallPolicy:
        """The policy of ``config``'s stall bounds (a ``DevicePoolConfig``, a ``RunConfig``)."""
        return cls(**fields_of(config, StallConfig))

    @property
    def ping_interval_s(self) -> float | None:
        """Seconds between pings to one busy worker; ``None`` when both bounds are off."""
        if self.heartbeat_timeout_s is not None:
            return min(_MAX_PING_INTERVAL_S, self.heartbeat_timeout_s / 4)
        return _MAX_PING_INTERVAL_S if self.stall_factor is not None else None

    def measured_bound_s(self, longest_s: float | None) -> float | None:
        """Longest a call may run given its method's longest earlier run (``None``: none)."""
        if self.stall_factor is None or longest_s is None:
            return None
        return max(self.stall_floor_s, self.stall_factor * longest_s)


@dataclass(frozen=True, kw_only=True)
class Beat:
    """A worker's answer to a ping: its pid and the call it is running, if any.

    ``longest_s``: the longest earlier run of ``role.method`` on this worker (``None`` before
    the first one finished). ``bounded``: the call takes the measured bound (no explicit
    ``timeout_s``).
    """

    pid: int
    role: str | None = None
    method: str | None = None
    running_s: float = 0.0
    longest_s: float | None = None
    bounded: bool = False


class PingedPool(Protocol):
    """What the watchdog needs from a pool (``pool.PoolBase`` provides it)."""

    @property
    def stall_policy(self) -> StallPolicy: ...

    @property
    def closed(self) -> bool: ...

    def heartbeat(self, pool_rank: int) -> ray.ObjectRef:
        """Ping worker ``pool_rank`` on its heartbeat thread (a ``Beat`` lands)."""
        ...

    def worker_pid(self, pool_rank: int) -> int | None: ...


@dataclass(frozen=True, kw_only=True)
class OwedCall:
    """A call a busy worker owes the waiting driver (``handle.busy_ranks`` lists them):
    what a stall error names."""

    role: str
    method: str
    rank: int  # role rank
    pool_rank: int
    node_ip: str
    pool: PingedPool  # whose worker ``pool_rank`` is pinged


@dataclass(kw_only=True)
class _RankWatch:
    """Ping state of one busy worker during one ``wait_all``."""

    pool: PingedPool
    pool_rank: int
    ping: ray.ObjectRef | None = None
    sent_at: float = -float("inf")
    unanswered_since: float | None = None  # send time of the first ping since the last answer
    beat: Beat | None = None
    dead: bool = False  # its actor died: the call's own ref reports that


@dataclass(kw_only=True)
class Watchdog:
    """Pings the workers that owe results to one ``wait_all`` and names a stalled one."""

    _watches: dict[tuple[int, int], _RankWatch] = field(default_factory=dict)
    _by_ref: dict[ray.ObjectRef, _RankWatch] = field(default_factory=dict)

    def ping_refs(self) -> list[ray.ObjectRef]:
        return list(self._by_ref)

    def owns(self, ref: ray.ObjectRef) -> bool:
        return ref in self._by_ref

    def update(self, busy: dict[tuple[int, int], OwedCall]) -> None:
        """Watch exactly the busy workers (``(id(pool), pool_rank)`` -> a call they owe)."""
        for key in [k for k in self._watches if k not in busy]:
            watch = self._watches.pop(key)
            if watch.ping is not None:
                self._by_ref.pop(watch.ping, None)
        for key, owed in busy.items():
            if key not in self._watches:
                self._watches[key] = _RankWatch(pool=owed.pool, pool_rank=owed.pool_rank)

    def send_due(self, now: float) -> None:
        """Ping each watched worker with no ping in flight whose interval has passed."""
        for watch in self._watches.values():
            interval = watch.pool.stall_policy.ping_interval_s
            watch.dead = watch.dead or watch.pool.closed  # its calls fail as dead actors
            if watch.dead or watch.ping is not None or interval is None:
                continue
            if now - watch.sent_at >= interval:
                watch.ping = watch.pool.heartbeat(watch.pool_rank)
                watch.sent_at = now
                if watch.unanswered_since is None:
                    watch.unanswered_since = now
                self._by_ref[watch.ping] = watch

    def wake_in(self, now: float) -> float | None:
        """Seconds until the next ping is due or a heartbeat bound can expire."""
        times = []
        for watch in self._watches.values():
            policy = watch.pool.stall_policy
            if watch.dead or policy.ping_interval_s is None:
                continue
            if watch.ping is None:
                times.append(watch.sent_at + policy.ping_interval_s)
            if watch.unanswered_since is not None and policy.heartbeat_timeout_s is not None:
                times.append(watch.unanswered_since + policy.heartbeat_timeout_s)
        return None if not times else max(0.0, min(times) - now)

    def answered(self, ref: ray.ObjectRef) -> None:
        """Record a landed ping: a Beat resets the heartbeat clock; a dead actor stops pings;
        any other error counts as no answer."""
        watch = self._by_ref.pop(ref)
        watch.ping = None
        try:
            beat = ray.get(ref, timeout=30.0)
        except rex.RayActorError:
            watch.dead = True
            return
        except rex.RayError:
            return
        watch.beat = beat
        watch.unanswered_since = None

    def stalled(self, busy: dict[tuple[int, int], OwedCall], now: float) -> StalledCallError | None:
        """The first busy worker past a bound, as an error naming role, method, rank, node."""
        for key, watch in self._watches.items():
            if watch.dead:
                continue
            if key not in busy:  # its last call just landed
                continue
            policy = watch.pool.stall_policy
            owed = busy[key]
            timeout = policy.heartbeat_timeout_s
            if (
                timeout is not None
                and watch.unanswered_since is not None
                and now - watch.unanswered_since >= timeout
                and not self._landed(watch)
            ):
                return _heartbeat_error(owed, watch, now - watch.unanswered_since)
            beat = watch.beat
            if beat is None or beat.role is None or not beat.bounded:
                continue
            bound = policy.measured_bound_s(beat.longest_s)
            if bound is not None and beat.running_s > bound:
                return _measured_error(owed, watch, beat, bound)
        return None

    def _landed(self, watch: _RankWatch) -> bool:
        """Last look before declaring a freeze: the answer may have landed unprocessed (the
        driver was busy fetching a large result)."""
        if watch.ping is None:
            return False
        ready, _ = ray.wait([watch.ping], timeout=0)
        if not ready:
            return False
        self.answered(watch.ping)
        return watch.unanswered_since is None or watch.dead


def _where(owed: OwedCall, pid: int | None) -> str:
    return f"rank {owed.rank} (pool rank {owed.pool_rank}, node {owed.node_ip}, pid {pid or '?'})"


def _pid(watch: _RankWatch) -> int | None:
    return watch.beat.pid if watch.beat is not None else watch.pool.worker_pid(watch.pool_rank)


def _heartbeat_error(owed: OwedCall, watch: _RankWatch, silent_s: float) -> StalledCallError:
    pid = _pid(watch)
    policy = watch.pool.stall_policy
    last = ""
    if watch.beat is not None and watch.beat.role is not None:
        beat = watch.beat
        last = (
            f" Its last answer said it was running role '{beat.role}' method "
            f"'{beat.method}' ({beat.running_s:.1f} s in)."
        )
    return StalledCallError(
        f"role '{owed.role}' method '{owed.method}' stalled on "
        f"{_where(owed, pid)}: its worker has not answered a heartbeat for "
        f"{silent_s:.1f} s (heartbeat_timeout_s={policy.heartbeat_timeout_s:g}). The process "
        "is frozen (SIGSTOP, a native call holding the GIL, swap, D-state) or its node is "
        f"unreachable.{last} The pool cannot continue; shut it down.",
        role=owed.role,
        method=owed.method,
        ranks=[owed.rank],
        pool_rank=owed.pool_rank,
        node_ip=owed.node_ip,
        pid=pid,
        reason="heartbeat",
    )


def _measured_error(
    owed: OwedCall, watch: _RankWatch, beat: Beat, bound: float
) -> StalledCallError:
    policy = watch.pool.stall_policy
    running = f"role '{beat.role}' method '{beat.method}'"
    behind = (
        ""
        if (beat.role, beat.method) == (owed.role, owed.method)
        else f" (the awaited call waits behind {running})"
    )
    return StalledCallError(
        f"role '{owed.role}' method '{owed.method}' stalled on "
        f"{_where(owed, beat.pid)}{behind}: {running} has run {beat.running_s:.1f} s "
        f"there, past max(stall_floor_s={policy.stall_floor_s:g}, stall_factor="
        f"{policy.stall_factor:g} x its longest earlier run {beat.longest_s:.1f} s) = "
        f"{bound:.1f} s. It is hung (a deadlock, a collective missing a peer) or far slower "
        "than before: raise stall_factor / stall_floor_s, or give the method an explicit "
        "@distributed(timeout_s=...). The pool cannot continue; shut it down.",
        role=owed.role,
        method=owed.method,
        ranks=[owed.rank],
        pool_rank=owed.pool_rank,
        node_ip=owed.node_ip,
        pid=beat.pid,
        reason="measured",
    )
