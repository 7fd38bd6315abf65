"""Reaper: ends what is left of a locally started Ray session once its driver is gone.

Ray already ties ``gcs_server``, ``raylet`` and the other processes ``ray.init()`` starts
to the driver (they die with it, SIGKILL included), and its workers exit with the raylet,
stopped ones too. But the raylet's dashboard and runtime-env agents, once they see the
raylet gone, try to report that to the dead GCS and block there: measured with Ray 2.60,
they outlive a SIGKILLed driver by 60-120 s (``ray/_private/process_watcher.py``,
``publish_error(..., timeout=60)``).

``start_reaper(roots)`` (called by ``ensure_ray`` after it started Ray) runs this file as
a small stdlib-only process beside the driver. While the driver lives it records, every
``SCAN_INTERVAL_S``, every process below ``roots`` (pid and start time, so a reused pid is
never hit). When the driver is gone (the reaper's parent changed) it sends SIGTERM to each
recorded process still alive and SIGKILL after ``GRACE_S``, logs what it ended to
``<session>/logs/unirl_reaper.log`` and exits. Bound: every process of the session is gone
within ``SCAN_INTERVAL_S + GRACE_S`` (about 3 s) of the driver's death, plus scheduling.
Linux only (``/proc``); elsewhere ``start_reaper`` returns ``None``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

SCAN_INTERVAL_S = 1.0
GRACE_S = 2.0

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def process_table() -> dict[int, tuple[int, int]]:
    """``{pid: (ppid, start time)}`` of every process readable in ``/proc``."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited while we listed
            continue
        fields = stat.rsplit(b")", 1)[1].split()  # the name in (...) may hold spaces
        table[int(name)] = (int(fields[1]), int(fields[19]))
    return table


def children_of(pid: int, table: dict[int, tuple[int, int]] | None = None) -> set[Proc]:
    """Direct children of ``pid`` as ``(pid, start time)``."""
    table = process_table() if table is None else table
    return {(p, start) for p, (ppid, start) in table.items() if ppid == pid}


def descendants(roots: set[Proc], table: dict[int, tuple[int, int]]) -> set[Proc]:
    """``roots`` still alive (same start time) and every process below them."""
    kids: dict[int, list[Proc]] = {}
    for pid, (ppid, start) in table.items():
        kids.setdefault(ppid, []).append((pid, start))
    found = {r for r in roots if table.get(r[0], (0, -1))[1] == r[1]}
    todo = [pid for pid, _ in found]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def alive(procs: set[Proc]) -> set[Proc]:
    """The ``procs`` that still exist as themselves (zombies count as gone)."""
    out = set()
    for pid, start in procs:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[19]) == start and fields[0] != b"Z":
            out.add((pid, start))
    return out


def start_reaper(roots: set[Proc], log_path: str) -> subprocess.Popen[bytes] | None:
    """Start the reaper for the process trees under ``roots`` (the processes ``ray.init``
    started); it ends them when this process dies. Returns the reaper process."""
    if not sys.platform.startswith("linux") or not roots:
        return None
    args = [str(os.getpid()), log_path, *(f"{pid}:{start}" for pid, start in sorted(roots))]
    return subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # no terminal signals: it must outlive the driver
        close_fds=True,
    )


def _end(procs: set[Proc]) -> tuple[set[Proc], set[Proc]]:
    """SIGTERM ``procs``, SIGKILL what is left after ``GRACE_S``; returns (termed, killed)."""
    termed = alive(procs)
    for pid, _ in termed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    left = termed
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = alive(left)
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return termed, left


def main(argv: list[str]) -> None:
    driver, log_path = int(argv[0]), argv[1]
    roots = {(int(p), int(s)) for p, s in (a.split(":") for a in argv[2:])}
    me = os.getpid()
    seen: set[Proc] = set()
    while os.getppid() == driver:
        seen = alive(seen) | descendants(roots, process_table())
        seen = {p for p in seen if p[0] != me}
        time.sleep(SCAN_INTERVAL_S)
    # the driver is gone: take a last look below what is still alive, then end it all
    seen = {p for p in descendants(alive(seen), process_table()) if p[0] != me}
    started = time.monotonic()
    termed, killed = _end(seen)
    if termed:
        line = (
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} driver pid {driver} is gone; ended "
            f"{len(termed)} leftover process(es) of its Ray session in "
            f"{time.monotonic() - started:.1f} s: SIGTERM {sorted(p for p, _ in termed)}, "
            f"SIGKILL {sorted(p for p, _ in killed)}\n"
        )
        try:
            with open(log_path, "a") as f:
                f.write(line)
        except OSError:
            pass


if __name__ == "__main__":
    main(sys.argv[1:])
