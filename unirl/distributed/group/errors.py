"""Errors the driver sees when remote work fails or a pool cannot be placed."""

from __future__ import annotations


class RemoteCallError(RuntimeError):
    """A call on a role failed: it raised, its worker died, it ran past its timeout, or it
    stalled (``StalledCallError``).

    ``role``, ``method`` and ``ranks`` (role ranks within the slab) say where;
    ``remote_traceback`` holds the remote traceback text when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        role: str,
        method: str,
        ranks: list[int],
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.role = role
        self.method = method
        self.ranks = list(ranks)
        self.remote_traceback = remote_traceback


class StalledCallError(RemoteCallError):
    """A call stalled: its worker stopped answering heartbeats (a frozen process or an
    unreachable node), or it ran far past its measured duration (a hang in a live process).

    ``pool_rank``, ``node_ip`` and ``pid`` name the process to inspect; ``reason`` is
    ``"heartbeat"`` or ``"measured"``.
    """

    def __init__(
        self,
        message: str,
        *,
        role: str,
        method: str,
        ranks: list[int],
        pool_rank: int,
        node_ip: str,
        pid: int | None,
        reason: str,
    ) -> None:
        super().__init__(message, role=role, method=method, ranks=ranks)
        self.pool_rank = pool_rank
        self.node_ip = node_ip
        self.pid = pid
        self.reason = reason


class PlacementError(RuntimeError):
    """The cluster cannot host the requested devices (or did not within the timeout)."""


class RoleFailure(Exception):
    """Raised inside a Worker when a role's code fails: carries the original exception's type
    name, message and formatted traceback as text, so it always pickles back to the driver."""

    def __init__(self, exc_type: str, message: str, traceback_text: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.message = message
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (RoleFailure, (self.exc_type, self.message, self.traceback_text))
