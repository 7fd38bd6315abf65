"""Stopping a run on request: ``SIGINT`` (Ctrl-C) or ``SIGTERM`` (a scheduler's preemption).

The first signal does not interrupt the rollout under way: ``StopRequest`` records it and the
loop, at the next rollout boundary, writes a checkpoint and ends with one line that says how
to continue (``resume=auto``). A second signal stops at once (``KeyboardInterrupt``), without
a checkpoint; the last complete one still resumes. Ray's own processes (GCS, raylet) share
the driver's process group and survive a terminal's Ctrl-C; the actors run in their own
groups, so only the driver sees it.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context that turns the first ``SIGINT`` / ``SIGTERM`` into a request
    (``requested``: the signal's name) and the second into ``KeyboardInterrupt``.

    Handlers are installed only in the main thread (Python allows no other) and the previous
    ones are put back on exit."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:  # the signals come back, come what may
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"{name} again: stopped at once, without a checkpoint")
        self.requested, self.signum = name, signum
        print(
            f"[unirl] {name}: stopping after this rollout, with a checkpoint (send it again "
            "to stop at once, without one)",
            file=sys.stderr,
            flush=True,
        )

    @property
    def exit_code(self) -> int:
        """``128 + signal number``, as a shell reports a process its signal ended."""
        return 128 + int(self.signum or signal.SIGINT)


def stop_line(signal_name: str, done: int, checkpoint: Path | None, total: int, root: Path) -> str:
    """The run's last line after a requested stop: where it stopped and how to continue."""
    if checkpoint is None:
        return (
            f"[unirl] stopped by {signal_name} before this run's first rollout (rollout "
            f"{done} of {total}); nothing new to save; outputs in {root}"
        )
    return (
        f"[unirl] stopped by {signal_name} after rollout {done} of {total}; checkpoint "
        f"{checkpoint}; continue with the same command and resume=auto"
    )
