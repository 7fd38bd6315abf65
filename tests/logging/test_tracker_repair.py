"""LocalTracker history repair: a torn last line is dropped (one line says so, naming the
file), a missing final newline is restored, a bad line before the last is an error naming
file and line; truncation is atomic and counts what it dropped."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from unirl.logging import LocalTracker

ROWS = [{"step": 0, "reward/mean": 0.5}, {"step": 1, "reward/mean": 0.75, "kl": 0.1}]


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _good() -> str:
    return "".join(json.dumps(r) + "\n" for r in ROWS)


def test_torn_last_line_is_dropped_with_a_message_and_logging_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, _good() + '{"step": 2, "reward/me')
    t = LocalTracker(tmp_path)
    assert capsys.readouterr().out == (
        f"[unirl] {jsonl}: dropped a torn last line (line 3, 22 characters: "
        '\'{"step": 2, "reward/me\') left by a run stopped mid-write (killed, or the disk '
        "was full); repaired\n"
    )
    assert t.rows == ROWS
    assert jsonl.read_text() == _good()
    t.log(2, {"reward/mean": 1.0})
    assert [json.loads(x)["step"] for x in _lines(jsonl)] == [0, 1, 2]
    with (tmp_path / "metrics.csv").open() as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["0", "1", "2"]


def test_zero_filled_tail_counts_as_torn(tmp_path: Path) -> None:
    jsonl = tmp_path / "eval_metrics.jsonl"
    _write(jsonl, _good() + "\0" * 16)  # what a crash can leave after the last write
    assert LocalTracker(tmp_path, prefix="eval_metrics").rows == ROWS
    assert jsonl.read_text() == _good()


def test_missing_final_newline_is_restored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, _good().rstrip("\n"))
    t = LocalTracker(tmp_path)
    assert capsys.readouterr().out == (
        f"[unirl] {jsonl}: added the newline missing after the last line; repaired\n"
    )
    t.log(2, {"reward/mean": 1.0})
    assert [json.loads(x)["step"] for x in _lines(jsonl)] == [0, 1, 2]


def test_intact_history_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, _good())
    before = jsonl.stat().st_mtime_ns
    assert LocalTracker(tmp_path).rows == ROWS
    assert capsys.readouterr().out == ""
    assert jsonl.stat().st_mtime_ns == before


def test_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, json.dumps(ROWS[0]) + "\n" + "garbage\n" + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(ValueError, match=rf"^{jsonl}:2 is not a JSON object"):
        LocalTracker(tmp_path)
    assert jsonl.read_text().count("\n") == 3  # untouched


def test_truncate_after_counts_and_rewrites_atomically(tmp_path: Path) -> None:
    t = LocalTracker(tmp_path)
    for step in range(4):
        t.log(step, {"reward/mean": float(step)})
    assert t.truncate_after(1) == 2
    assert t.truncate_after(1) == 0
    assert [json.loads(x)["step"] for x in _lines(tmp_path / "metrics.jsonl")] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv", "metrics.jsonl"]
    assert LocalTracker(tmp_path).truncate_after(-1) == 2
    assert (tmp_path / "metrics.jsonl").read_text() == ""
