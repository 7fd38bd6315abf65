"""When syncs happen (``SyncedRollout`` + ``WeightSyncDriver.due``), with fake handles: forced
before the first rollout of a run (fresh or resumed), then per ``interval`` after training,
an eval pushes the current (EMA) weights and the next train rollout re-syncs; colocated
engines are woken for sampling and put back to sleep."""

from __future__ import annotations

from typing import Any

from unirl.distributed.weight_sync import LoraSync, WeightSyncDriver
from unirl.trainer.dedicated import SyncedRollout


class FakeEngine:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def wake_up(self) -> None:
        self.log.append("wake")

    def sleep(self) -> None:
        self.log.append("sleep")

    def generate(self, req: Any) -> str:
        self.log.append(f"generate:{req.mode}")
        return "resp"


class FakeDriver(WeightSyncDriver):
    def __init__(self, interval: int, log: list[str]) -> None:
        super().__init__(
            sync=LoraSync(), source=None, engine=None, layout="colocate", interval=interval
        )
        self.log = log

    def run(self, *, reason: str = "interval") -> dict[str, float]:
        self.log.append(f"sync:{reason}")
        return {"sync/time_s": 1.0, "sync/bytes": 10.0, "sync/forced": float(reason != "interval")}


class Req:
    def __init__(self, mode: str) -> None:
        self.mode = mode


def _loop(
    interval: int, *, colocate: bool, start: int = 0, eval_after: int | None = None
) -> tuple[list[str], list[dict]]:
    log: list[str] = []
    rollout = SyncedRollout(
        engine=FakeEngine(log), driver=FakeDriver(interval, log), colocate=colocate
    )
    metrics = []
    for k in range(start, start + 4):
        rollout.generate(Req("train"))
        log.append(f"train:{k}")
        metrics.append(rollout.after_train(k))
        if eval_after is not None and k == eval_after:
            rollout.generate(Req("eval"))
    return log, metrics


def test_interval_one_syncs_before_every_rollout() -> None:
    log, metrics = _loop(1, colocate=False)
    assert [x for x in log if x.startswith("sync")] == [
        "sync:first",
        "sync:interval",
        "sync:interval",
        "sync:interval",
    ]
    assert [m["sync/forced"] for m in metrics] == [1.0, 0.0, 0.0, 0.0]


def test_interval_two_and_resume_force_the_first_sync() -> None:
    log, _ = _loop(2, colocate=False, start=5)  # resumed at rollout 5: rollouts 5..8
    order = [x for x in log if x.startswith(("sync", "train"))]
    # forced before 5; due after training 5 and 7 ((k + 1) % 2 == 0), so before 6 and 8
    assert order == [
        "sync:first",
        "train:5",
        "sync:interval",
        "train:6",
        "train:7",
        "sync:interval",
        "train:8",
    ]


def test_eval_pushes_current_weights_then_train_resyncs() -> None:
    log, metrics = _loop(3, colocate=False, eval_after=0)
    assert log[:6] == [
        "sync:first",
        "generate:train",
        "train:0",
        "sync:eval",
        "generate:eval",
        "sync:after_eval",
    ]
    assert metrics[1]["sync/bytes"] == 20.0  # eval sync + re-sync, summed into the next log row


def test_colocated_engine_sleeps_around_training() -> None:
    log, _ = _loop(1, colocate=True)
    assert log[:5] == ["wake", "sync:first", "generate:train", "sleep", "train:0"]
    assert log.count("wake") == log.count("sleep") == 4
