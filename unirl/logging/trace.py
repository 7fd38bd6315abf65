"""Where a worker's GPU waits: a summary of a ``torch.profiler`` Chrome trace.

:func:`summarize_trace` reads the trace's device events (kernels, copies, memsets) and the
``unirl/...`` ranges the code marks with ``torch.profiler.record_function`` (pipeline phases,
reward, the train stack's parts), and returns:

- ``window_ms``: from the first to the last event; ``gpu_busy_ms``: the union of device
  events; ``gpu_idle_ms`` and ``busy_fraction``;
- ``ranges``: per range name, its calls, CPU wall time and the device-busy time inside its
  wall intervals (the device runs behind the CPU, so this is what overlapped the range);
- ``gaps``: the longest device-idle intervals between device events, each with the range
  and the CPU op that launched the work ending it (through the launch's correlation id;
  else what was open on the CPU when the gap began); ``long_gaps`` / ``long_gap_idle_ms``
  count those of at least ``min_gap_us``, ``short_gap_idle_ms`` sums the shorter ones (many
  short gaps: the CPU launching kernels slower than the device runs them).

``bench --profile DIR`` writes one per worker beside the gzipped trace.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
RANGE_PREFIX = "unirl/"


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(merged: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of ``[start, end]`` covered by the sorted, disjoint ``merged`` intervals."""
    i = max(bisect.bisect_right(merged, (start, float("inf"))) - 1, 0)
    total = 0.0
    while i < len(merged) and merged[i][0] < end:
        total += max(0.0, min(end, merged[i][1]) - max(start, merged[i][0]))
        i += 1
    return total


def _innermost(spans: list[dict[str, Any]], t: float) -> str | None:
    """Name of the shortest span that contains time ``t``."""
    best: dict[str, Any] | None = None
    for s in spans:
        if s["ts"] <= t <= s["ts"] + s["dur"] and (best is None or s["dur"] < best["dur"]):
            best = s
    return None if best is None else str(best["name"])


def summarize_trace(trace: dict[str, Any], *, top: int = 15, min_gap_us: float = 50.0) -> dict:
    """The summary above of a Chrome trace dict (``torch.profiler``'s
    ``export_chrome_trace`` output); ``top`` gaps of at least ``min_gap_us`` are listed."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    if not events:
        raise ValueError("the trace has no complete ('X') events: was anything profiled?")
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    ranges = [
        e
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(RANGE_PREFIX)
    ]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    busy = _merge([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device])
    busy_us = sum(b - a for a, b in busy)

    per_range: dict[str, dict[str, float]] = {}
    for r in ranges:
        a, b = float(r["ts"]), float(r["ts"]) + float(r["dur"])
        row = per_range.setdefault(r["name"], {"calls": 0, "wall_ms": 0.0, "gpu_busy_ms": 0.0})
        row["calls"] += 1
        row["wall_ms"] += (b - a) / 1e3
        row["gpu_busy_ms"] += _overlap(busy, a, b) / 1e3

    intervals = [(b0, a1) for (_, b0), (a1, _) in itertools.pairwise(busy)]
    long = sorted((g for g in intervals if g[1] - g[0] >= min_gap_us), key=lambda g: g[0] - g[1])
    short_us = sum(b - a for a, b in intervals if b - a < min_gap_us)
    first_start: dict[float, dict[str, Any]] = {}
    for e in device:
        first_start.setdefault(float(e["ts"]), e)
    gaps: list[dict[str, Any]] = []
    for gap_start, gap_end in long[:top]:  # attributed: only the longest (a linear scan each)
        ending = first_start.get(gap_end)
        launch = launches.get((ending or {}).get("args", {}).get("correlation"))
        at = float(launch["ts"]) if launch is not None else gap_start
        gaps.append(
            {
                "at_ms": round((gap_start - start) / 1e3, 3),
                "gap_ms": round((gap_end - gap_start) / 1e3, 3),
                "range": _innermost(ranges, at),
                "cpu_op": _innermost(cpu_ops, at),
                "next": None if ending is None else str(ending.get("name", ""))[:80],
            }
        )
    window_us = end - start
    return {
        "window_ms": round(window_us / 1e3, 3),
        "gpu_busy_ms": round(busy_us / 1e3, 3),
        "gpu_idle_ms": round((window_us - busy_us) / 1e3, 3),
        "busy_fraction": round(busy_us / window_us, 4) if window_us > 0 else 0.0,
        "device_events": len(device),
        "long_gaps": len(long),
        "long_gap_idle_ms": round(sum(b - a for a, b in long) / 1e3, 3),
        "short_gap_idle_ms": round(short_us / 1e3, 3),
        "ranges": {
            name: {k: round(v, 3) for k, v in row.items()}
            for name, row in sorted(per_range.items())
        },
        "gaps": gaps,
    }
