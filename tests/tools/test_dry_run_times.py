"""``python -m unirl.tools.dry_run_times``: every recipe found with its entrypoint, a dry run
timed per recipe in a fresh process, failures and the limit reflected in the exit status
(the times themselves are recorded in docs, never asserted here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unirl.tools import dry_run_times


def test_every_recipe_is_found_with_its_entrypoint() -> None:
    found = dict(dry_run_times.recipes(dry_run_times.ROOT / "examples"))
    shipped = list((dry_run_times.ROOT / "examples").glob("*/*.yaml"))
    assert len(found) == len(shipped) and len(found) > 50
    assert found["llm/qwen3_tiny_grpo"] == "unirl.train_vlm"
    assert found["diffusion/sd3_tiny_trainside"] == "unirl.train_diffusion"
    assert found["pe/pe_tiny_trainside"] == "unirl.train_pe"


def test_a_dry_run_is_timed_and_a_failure_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "times.json"
    assert (
        dry_run_times.main(["--only", "llm/qwen3_tiny_grpo", "--limit", "600", "--json", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["llm/qwen3_tiny_grpo"]
    assert rows[0]["status"] == 0 and rows[0]["wall_s"] >= rows[0]["cpu_s"] * 0.5 > 0
    # over the limit: the exit status says so
    assert dry_run_times.main(["--only", "llm/qwen3_tiny_grpo", "--limit", "0.01"]) == 1
    # a recipe that does not compose fails with its error line
    monkeypatch.setattr(
        dry_run_times, "recipes", lambda *_: [("llm/no_such_recipe", "unirl.train_vlm")]
    )
    assert dry_run_times.main(["--limit", "600"]) == 1
    assert "FAIL llm/no_such_recipe" in capsys.readouterr().out
