"""No hangs: a frozen worker fails the run within its heartbeat bound, a call far past its
measured duration fails within its measured bound, and a SIGKILLed driver leaves no process
of its Ray session behind.

Bounds (README "Stalls", "Driver death"): a freeze is named within ``heartbeat_timeout_s +
ping_interval_s`` (5 + 1.25 s here); a hang within ``max(stall_floor_s, stall_factor x
longest earlier run) + ping_interval_s``; the reaper ends a dead driver's session within
``SCAN_INTERVAL_S + GRACE_S`` (about 3 s). The asserts allow several times that for a slow,
loaded 2-core CI machine. Processes are identified by pid and start time below the driver
(``/proc``), so other Ray sessions on the machine do not interfere.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ray_env import quiet_ray_env
from unirl_group_roles import Reader, Store

from unirl.config import ConfigError
from unirl.config.run import RunConfig
from unirl.distributed.group import (
    DevicePool,
    DevicePoolConfig,
    StalledCallError,
    StallPolicy,
    placement,
    remote,
)

pytestmark = pytest.mark.ray
linux_only = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="identifies processes through Linux /proc"
)

DRIVER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import ray
    from unirl.distributed.group import DevicePool, DevicePoolConfig, placement, remote
    from unirl_group_roles import Reader, Store

    mode = sys.argv[1]
    config = DevicePoolConfig(num_devices=2, device="cpu", name="driver",
                              heartbeat_timeout_s=5.0, log_to_driver=False)
    with DevicePool(config) as pool:
        with placement(pool):
            store = remote(Store, name="store")
            reader = remote(Reader, name="reader", store=store)
        pending = reader.call_async("nap", 300.0)
        frozen = pool.worker_info[1]["pid"]
        print(json.dumps({
            "workers": [w["pid"] for w in pool.worker_info],
            "session": ray.get_runtime_context().get_session_name(),
        }), flush=True)
        time.sleep(0.5)  # the call is running on both ranks
        os.kill(frozen, signal.SIGSTOP)
        stopped = time.monotonic()
        if mode == "wait_for_kill":
            time.sleep(600)
        try:
            if mode == "cleanup":  # the trainer's pattern: a cleanup call on the same workers
                from unirl.trainer.base import after_failure_skip_stalled
                with after_failure_skip_stalled(lambda: reader.call("who")):
                    pending.result()
            else:
                pending.result()
        finally:
            print(json.dumps({"detected_after_s": time.monotonic() - stopped}), flush=True)
    """
)


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """``{pid: (ppid, start time, state)}`` from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = stat.rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), int(fields[19]), fields[0].decode())
    return table


def _tree(root: int) -> dict[int, int]:
    """Every process below ``root``: ``{pid: start time}``."""
    table = _proc_table()
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _alive(procs: dict[int, int]) -> dict[int, str]:
    """The ``procs`` still running as themselves (zombies are gone): ``{pid: cmdline}``
    (arguments NUL-separated)."""
    table = _proc_table()
    out = {}
    for pid, start in procs.items():
        entry = table.get(pid)
        if entry is not None and entry[1] == start and entry[2] != "Z":
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
    return out


def _short(cmdlines: dict[int, str]) -> dict[int, str]:
    return {pid: cmd.replace("\0", " ")[:100] for pid, cmd in cmdlines.items()}


def _wait_gone(procs: dict[int, int], limit_s: float) -> tuple[float, dict[int, str]]:
    start = time.monotonic()
    left = _alive(procs)
    while left and time.monotonic() - start < limit_s:
        time.sleep(0.25)
        left = _alive(procs)
    return time.monotonic() - start, left


StartDriver = Callable[[str], subprocess.Popen[str]]


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[tuple[StartDriver, dict[int, int]]]:
    """Starts DRIVER (its own Ray, started by DevicePool); yields it and, once the test has
    filled it, the snapshot of its process tree, which is cleaned up whatever happens."""
    env = {**os.environ, **quiet_ray_env()}
    env.pop("RAY_ADDRESS", None)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    snapshot: dict[int, int] = {}
    procs: list[subprocess.Popen[str]] = []

    def start(mode: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(script), mode],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start, snapshot
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    for pid in _alive(snapshot):  # never leave a stopped worker or agent behind on CI
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def _first_json(proc: subprocess.Popen[str], timeout_s: float = 180.0) -> dict:
    """The driver's first stdout line (it prints whole lines), within ``timeout_s``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
        pytest.fail(f"driver printed nothing within {timeout_s:g} s; stderr:\n{stderr[-4000:]}")
    return json.loads(line)


@linux_only
def test_frozen_worker_fails_the_run_naming_role_method_rank_node_pid(driver) -> None:
    start, snapshot = driver
    t0 = time.monotonic()
    proc = start("raise")
    info = _first_json(proc)
    t_up = time.monotonic() - t0
    snapshot.update(_tree(proc.pid))
    frozen = info["workers"][1]
    assert frozen in snapshot
    try:
        stdout, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the driver still waits on its frozen worker after 90 s")
    t_exit = time.monotonic() - t0
    assert proc.returncode == 1, stderr[-4000:]
    detected = json.loads(stdout.strip().splitlines()[-1])["detected_after_s"]
    # bound: heartbeat_timeout_s + ping interval = 5 + 1.25 s
    assert 3.5 <= detected <= 20.0, detected
    head = "unirl.distributed.group.errors.StalledCallError: "
    lines = [line for line in stderr.splitlines() if line.startswith(head)]
    assert lines, stderr[-4000:]
    message = lines[-1]
    assert message.startswith(
        f"{head}role 'reader' method 'nap' stalled on rank 1 (pool rank 1, node "
    ), message
    assert f", pid {frozen}): its worker has not answered a heartbeat for " in message
    # the pool shut down and Ray with it: no process of the run is left, the frozen one included
    elapsed, left = _wait_gone(snapshot, 30.0)
    print(
        f"driver up {t_up:.1f} s, freeze named after {detected:.1f} s, driver exited at "
        f"{t_exit:.1f} s, its processes gone {elapsed:.1f} s later"
    )
    assert not left, f"still alive {elapsed:.1f} s after the driver exited: {_short(left)}"


@linux_only
def test_a_stall_inside_a_cleanup_block_is_named_within_one_bound(driver) -> None:
    """The trainer samples inside a block whose cleanup (``ops.end_sampling``) calls the same
    workers: a frozen worker fails the run within the one documented bound (heartbeat_timeout_s
    + ping interval = 5 + 1.25 s here), naming the call that stalled, not a second bound later
    naming the cleanup (measured 74-77 s against 35 s at the defaults before)."""
    start, snapshot = driver
    proc = start("cleanup")
    info = _first_json(proc)
    snapshot.update(_tree(proc.pid))
    try:
        stdout, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the driver still waits on its frozen worker after 90 s")
    assert proc.returncode == 1, stderr[-4000:]
    detected = json.loads(stdout.strip().splitlines()[-1])["detected_after_s"]
    bound = 5.0 + 1.25
    print(f"freeze named after {detected:.1f} s (bound {bound} s)")
    # one bound (+4 s of slack for a loaded machine), not two: the cleanup waits >= 5 s more
    assert 3.5 <= detected < bound + 4.0, detected
    head = "unirl.distributed.group.errors.StalledCallError: "
    message = [line for line in stderr.splitlines() if line.startswith(head)][-1]
    assert message.startswith(f"{head}role 'reader' method 'nap' stalled on rank 1 "), message
    assert f"pid {info['workers'][1]}" in message


@linux_only
def test_sigkilled_driver_leaves_no_ray_process_behind(driver) -> None:
    start, snapshot = driver
    proc = start("wait_for_kill")
    info = _first_json(proc)
    time.sleep(1.0)  # one worker frozen, the other busy: the hardest orphans to end
    snapshot.update(_tree(proc.pid))
    cmdlines = _alive(snapshot)
    session_dir_procs = [pid for pid, cmd in cmdlines.items() if info["session"] in cmd]
    assert len(session_dir_procs) >= 2, _short(cmdlines)  # gcs_server and raylet
    assert set(info["workers"]) <= set(snapshot)
    assert any("reaper.py" in cmd for cmd in cmdlines.values()), _short(cmdlines)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    # bound: the reaper notices within 1 s and SIGKILLs what ignores SIGTERM after 2 s
    elapsed, left = _wait_gone(snapshot, 30.0)
    print(f"{len(snapshot)} processes of the SIGKILLed driver gone after {elapsed:.1f} s")
    assert not left, f"alive {elapsed:.1f} s after the driver was SIGKILLed: {_short(left)}"
    assert elapsed < 15.0


def test_call_far_past_its_measured_duration_fails(ray_session: None) -> None:
    config = DevicePoolConfig(
        num_devices=2,
        device="cpu",
        name="measured",
        heartbeat_timeout_s=4.0,  # pings every 1 s
        stall_factor=1.5,
        stall_floor_s=0.3,
        log_to_driver=False,
    )
    with DevicePool(config) as pool:
        with placement(pool):
            store = remote(Store, name="store")
            reader = remote(Reader, name="reader", store=store)
        assert reader.nap(1.2) == [1.2, 1.2]  # first run: no measured bound (floor 0.3 s)
        # an explicit timeout replaces the measured bound (1.5 x 1.2 s would fail this one)
        assert reader.options(timeout_s=60).nap(3.0) == [3.0, 3.0]
        start = time.monotonic()
        with pytest.raises(StalledCallError) as err:
            reader.nap(120.0)  # bound: max(0.3, 1.5 x 3.0) = 4.5 s, + 1 s ping interval
        elapsed = time.monotonic() - start
        print(f"hang named after {elapsed:.1f} s (bound 4.5 s + 1 s ping interval)")
        assert 4.5 <= elapsed <= 20.0, elapsed
        message = str(err.value)
        assert message.startswith("role 'reader' method 'nap' stalled on rank ")
        assert "(pool rank " in message and ", node " in message and ", pid " in message
        assert "past max(stall_floor_s=0.3, stall_factor=1.5 x its longest earlier run 3.0 s)" in (
            message
        )
        assert err.value.reason == "measured"
        assert err.value.pid in [w["pid"] for w in pool.worker_info]


def test_stall_bounds_are_validated() -> None:
    # one rule and one message, whether the bounds come from a recipe or build a pool
    for build in (DevicePoolConfig, RunConfig, StallPolicy):
        with pytest.raises(ConfigError, match=r"^stall_factor=0\.5 must be >= 1 or null \(off\)"):
            build(stall_factor=0.5)
        with pytest.raises(ConfigError, match=r"^heartbeat_timeout_s=-1\.0 must be > 0 or null"):
            build(heartbeat_timeout_s=-1.0)
    cfg = RunConfig(heartbeat_timeout_s=None, stall_factor=None)
    assert (cfg.heartbeat_timeout_s, cfg.stall_factor, cfg.stall_floor_s) == (None, None, 300.0)
