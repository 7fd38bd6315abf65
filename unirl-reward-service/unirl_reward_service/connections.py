"""Connection limits for uvicorn, and logs that a flood of bad clients cannot grow.

uvicorn accepts every connection and keeps a silent one open forever (its keep-alive timer
starts only after a first answer), so idle sockets can exhaust the process's file
descriptors. :func:`uvicorn_config` serves the app with :class:`ConnectionGuard`'s protocol:

- at most ``server.max_connections`` connections are open; a new one over the limit closes
  the connection that has been idle (no request in progress) the longest, so idle sockets
  cannot lock clients out; when none has been idle for ``min(1 s, header_timeout_s / 10)``
  (every connection has a request in progress, or all just opened) it is answered 503
  (``Retry-After: 1``) and closed;
- a connection that has not delivered a complete request head ``server.header_timeout_s``
  after opening (or after its previous answer) is closed: silent sockets and slowloris
  headers both end there (the body has ``server.body_timeout_s``, see
  :class:`~unirl_reward_service.middleware.BodyLimit`);
- refused, evicted and timed-out connections are counted and logged as one summary line at
  most every ``log_every_s``; uvicorn's and asyncio's own warnings are rate-limited per
  message (:class:`RateLimitedLog`), and query strings are cut from access-log lines
  (:class:`RedactQuery`), so a token put in a URL is never written down.

The protocol subclasses uvicorn's h11 implementation and reads its ``cycle`` (the request in
progress); ``tests/test_service_hardening.py`` pins that behaviour against the installed
uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from unirl_reward_service.config import ServerConfig

logger = logging.getLogger("uvicorn.error")

_BUSY_BODY = (
    b'{"detail":"server busy: every connection has a request in progress; retry","errors":[]}'
)
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\n" + _BUSY_BODY
)


class ConnectionGuard:
    """Open connections of one server (oldest first) and counts of those it turned away."""

    def __init__(
        self, *, max_connections: int, header_timeout_s: float, log_every_s: float = 10.0
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.log_every_s = log_every_s
        self.min_idle_s = min(1.0, header_timeout_s / 10)
        self.open: dict[GuardedH11Protocol, None] = {}
        self.totals = {"refused": 0, "evicted": 0, "timed_out": 0}
        self._window = dict.fromkeys(self.totals, 0)
        self._last_log = -math.inf

    def admit(self) -> bool:
        """Room for one more connection, closing the longest-idle one if at the limit.

        Only a connection idle for ``min_idle_s`` is closed, so a burst of new connections
        does not close each other before their requests arrive (the burst gets 503s).
        """
        if len(self.open) < self.max_connections:
            return True
        idle = [c for c in self.open if not c.busy]
        victim = min(idle, key=lambda c: c.idle_since, default=None)
        if victim is None or time.monotonic() - victim.idle_since < self.min_idle_s:
            return False
        self.open.pop(victim, None)
        victim.transport.close()
        self.note("evicted")
        return True

    def note(self, event: str) -> None:
        """Count ``event``; log the counts of the last window (one line per ``log_every_s``)."""
        self.totals[event] += 1
        self._window[event] += 1
        now = time.monotonic()
        if now - self._last_log < self.log_every_s:
            return
        self._last_log = now
        counts = ", ".join(f"{n} {event}" for event, n in self._window.items() if n)
        self._window = dict.fromkeys(self.totals, 0)
        logger.warning(
            "connections turned away since the last report: %s (server.max_connections=%d, "
            "server.header_timeout_s=%g; reported at most every %gs)",
            counts,
            self.max_connections,
            self.header_timeout_s,
            self.log_every_s,
        )

    def protocol(self) -> type[H11Protocol]:
        """uvicorn's h11 protocol class bound to this guard (``uvicorn.Config(http=...)``)."""
        return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": self})


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionGuard`'s limit and header timeout."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.admitted = self.guard.admit()
        self.idle_since = time.monotonic()
        self.header_timer: asyncio.TimerHandle | None = None
        if not self.admitted:
            transport.write(_BUSY)
            transport.close()
            self.guard.note("refused")
            return
        super().connection_made(transport)
        self.guard.open[self] = None
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.admitted:
            return
        self.guard.open.pop(self, None)
        if self.header_timer is not None:
            self.header_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.idle_since = time.monotonic()
            self._arm_header_timer()

    @property
    def busy(self) -> bool:
        """A request head has arrived and its answer is not complete."""
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.guard.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.busy or self.transport.is_closing():
            return  # a request is running; the next answer re-arms the timer
        self.guard.note("timed_out")
        self.transport.close()


class RateLimitedLog(logging.Filter):
    """Let through at most one WARNING-or-above record per message per ``every_s``; the next
    one that passes says how many were dropped. Lower levels pass untouched."""

    def __init__(self, every_s: float = 10.0, max_keys: int = 1024) -> None:
        super().__init__()
        self.every_s = every_s
        self.max_keys = max_keys
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        with self._lock:
            last, dropped = self._seen.get(key, (-math.inf, 0))
            if now - last < self.every_s:
                self._seen[key] = (last, dropped + 1)
                return False
            if len(self._seen) >= self.max_keys:
                self._seen.clear()
            self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this in the last {self.every_s:g}s]"
        return True


class RedactQuery(logging.Filter):
    """Cut the query string from every argument of a record (uvicorn's access line carries
    the path with its query): a token sent in a URL is refused, and never logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(
            isinstance(a, str) and "?" in a for a in record.args
        ):
            record.args = tuple(
                a.split("?", 1)[0] + "?<redacted>" if isinstance(a, str) and "?" in a else a
                for a in record.args
            )
        return True


def install_log_filters() -> None:
    """Rate-limit uvicorn's and asyncio's warnings and redact access-log queries (idempotent)."""
    for name in ("uvicorn", "uvicorn.error", "asyncio"):
        target = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedLog) for f in target.filters):
            target.addFilter(RateLimitedLog())
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQuery) for f in access.filters):
        access.addFilter(RedactQuery())


def uvicorn_config(app: Any, server: ServerConfig, **overrides: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` on ``server.host:server.port`` with the limits of
    ``server`` (connections, header and keep-alive timeouts) and the log filters.

    ``overrides`` go to ``uvicorn.Config`` (``log_level``, ``access_log``, ...). WebSocket
    upgrades are off (the API has none). ``limit_concurrency`` is twice ``max_connections``:
    it bounds request tasks still running for clients that already hung up.
    """
    guard = ConnectionGuard(
        max_connections=server.max_connections, header_timeout_s=server.header_timeout_s
    )
    settings: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "http": guard.protocol(),
        "ws": "none",
        "timeout_keep_alive": server.keep_alive_s,
        "limit_concurrency": 2 * server.max_connections,
        **overrides,
    }
    config = uvicorn.Config(app, **settings)
    install_log_filters()  # after uvicorn.Config, which (re)configures the loggers
    return config


def ensure_fd_limit(max_connections: int, reserve: int = 256) -> None:
    """Raise the soft open-files limit to ``max_connections + reserve`` if it is lower (up to
    the hard limit); refuse to start when even the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + reserve
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(
            f"unirl-reward-service: server.max_connections={max_connections} needs about "
            f"{needed} open files but the hard limit is {hard}: lower server.max_connections "
            f"or raise the limit (ulimit -Hn)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
