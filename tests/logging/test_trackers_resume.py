"""W&B keeps one run per run folder (its id in ``wandb_run_id``; a resumed run continues it),
and a text run's samples reach TensorBoard and W&B as tables. W&B runs offline here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unirl.logging import build_trackers
from unirl.logging.trackers import WANDB_RUN_ID

ROWS = [
    {"prompt": "What is 3 + 6?", "completion": "\\boxed{9}", "reward": 1.25, "answer": "9"},
    {"prompt": "a | b", "completion": "x\ny", "reward": 0.0},
]


def _samples(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_a_resumed_wandb_run_keeps_one_run_id(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="wandb is an optional extra: pip install 'unirl-mm[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = build_trackers(["local", "wandb"], tmp_path, config={"seed": 0})
    run_id = first.trackers[1].run.id
    first.log(0, {"reward/mean": 0.1})
    first.log_external(0, {}, media={"samples/samples": _samples(tmp_path / "s.jsonl")})
    first.close()
    assert (tmp_path / WANDB_RUN_ID).read_text() == run_id + "\n"

    second = build_trackers(["local", "wandb"], tmp_path, config={"seed": 0})  # resume
    assert second.trackers[1].run.id == run_id
    second.log(1, {"reward/mean": 0.2})
    second.close()
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs), runs


def test_text_samples_reach_tensorboard_as_a_table(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = build_trackers(["local", "tensorboard"], tmp_path / "run", config={})
    trackers.log_external(10, {}, media={"samples/samples": _samples(tmp_path / "s.jsonl")})
    trackers.close()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (event,) = events.Tensors("samples/samples/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 10
    assert text.splitlines() == [
        "| prompt | completion | reward | answer |",
        "|---|---|---|---|",
        "| What is 3 + 6? | \\boxed{9} | 1.25 | 9 |",
        "| a \\| b | x y | 0.0 | None |",
    ]
