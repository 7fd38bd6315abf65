"""The trace summary (``unirl.logging.trace``) on a hand-built Chrome trace whose busy time,
gaps and attributions are known exactly."""

from __future__ import annotations

import pytest

from unirl.logging.trace import summarize_trace


def _x(cat: str, name: str, ts: float, dur: float, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def _trace() -> dict:
    # CPU: unirl/train/reference over [0, 100], unirl/train/backward over [100, 400];
    # the backward's second launch (correlation 3) happens late, at 350, inside an aten op
    return {
        "traceEvents": [
            _x("user_annotation", "unirl/train/reference", 0, 100),
            _x("user_annotation", "unirl/train/backward", 100, 300),
            _x("user_annotation", "other/range", 0, 400),  # not ours: not reported
            _x("cpu_op", "aten::mm", 5, 10),
            _x("cpu_op", "aten::item", 340, 20),
            _x("cuda_runtime", "cudaLaunchKernel", 6, 2, correlation=1),
            _x("cuda_runtime", "cudaLaunchKernel", 30, 2, correlation=2),
            _x("cuda_runtime", "cudaLaunchKernel", 350, 2, correlation=3),
            # device: [10, 60] and [50, 120] overlap -> one busy interval [10, 120];
            # idle [120, 360]; busy [360, 400]
            _x("kernel", "gemm_a", 10, 50, correlation=1),
            _x("kernel", "gemm_b", 50, 70, correlation=2),
            _x("kernel", "attention_bwd", 360, 40, correlation=3),
            {"ph": "i", "name": "instant", "ts": 500},  # not a complete event: ignored
        ]
    }


def test_busy_time_merges_overlapping_device_events() -> None:
    s = summarize_trace(_trace())
    assert s["window_ms"] == pytest.approx(0.4)
    assert s["gpu_busy_ms"] == pytest.approx(0.110 + 0.040)
    assert s["gpu_idle_ms"] == pytest.approx(0.4 - 0.150)
    assert s["busy_fraction"] == pytest.approx(0.375)
    assert s["device_events"] == 3
    assert (s["long_gaps"], s["long_gap_idle_ms"], s["short_gap_idle_ms"]) == (1, 0.24, 0.0)


def test_ranges_count_calls_wall_and_overlapping_device_time() -> None:
    s = summarize_trace(_trace())
    assert set(s["ranges"]) == {"unirl/train/reference", "unirl/train/backward"}
    ref = s["ranges"]["unirl/train/reference"]
    assert ref == {"calls": 1, "wall_ms": 0.1, "gpu_busy_ms": 0.09}  # [10, 100]
    bwd = s["ranges"]["unirl/train/backward"]
    assert bwd == {"calls": 1, "wall_ms": 0.3, "gpu_busy_ms": 0.06}  # [100, 120] + [360, 400]


def test_a_gap_is_blamed_on_the_launch_that_ended_it() -> None:
    (gap,) = summarize_trace(_trace())["gaps"]
    assert gap == {
        "at_ms": 0.12,
        "gap_ms": 0.24,
        "range": "unirl/train/backward",
        "cpu_op": "aten::item",
        "next": "attention_bwd",
    }


def test_short_gaps_are_left_out_and_an_empty_trace_is_refused() -> None:
    s = summarize_trace(_trace(), min_gap_us=241.0)
    assert s["gaps"] == [] and s["long_gaps"] == 0
    assert s["short_gap_idle_ms"] == pytest.approx(0.24)  # counted among the short ones
    with pytest.raises(ValueError, match="no complete"):
        summarize_trace({"traceEvents": []})
