"""A fresh run never lands on an earlier run silently: refused before Ray unless ``resume``
or ``overwrite=true``; ``overwrite`` clears what the earlier run left. ``keep_last`` prunes
old checkpoints after each save."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from unirl.config import ConfigError
from unirl.config.entry import compose_recipe
from unirl.config.run import RunConfig
from unirl.config.validate import validate
from unirl.trainer.base import StageTrainer
from unirl.trainer.output import DRIVER_STATE, OutputDir
from unirl.trainer.stage import Stage


def _validate(out: Path, *extra: str) -> None:
    validate(compose_recipe("diffusion/sd3_tiny_trainside", [f"output_dir={out}", *extra]))


def test_fresh_run_into_a_run_folder_is_refused_unless_resume_or_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _validate(out)  # a new folder
    (out / "checkpoints").mkdir(parents=True)
    _validate(out)  # an empty checkpoints/ holds nothing
    (out / "checkpoints" / "step_000004").mkdir()
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints\); pass resume=auto"):
        _validate(out)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ConfigError, match=r"\(metrics.jsonl, checkpoints\)"):
        _validate(out)
    _validate(out, "resume=auto")
    _validate(out, "overwrite=true")


def test_clear_run_removes_what_an_earlier_run_left(tmp_path: Path) -> None:
    out = OutputDir(tmp_path / "run")
    for folder in ("checkpoints/step_000004", "samples", "lora", "lora_ema", "eval"):
        (out.root / folder).mkdir(parents=True)
    for name in ("metrics.jsonl", "metrics.csv", "eval_metrics.jsonl", "config.yaml"):
        (out.root / name).write_text("x")
    removed = out.clear_run()
    assert sorted(removed) == sorted(
        [
            "checkpoints/",
            "samples/",
            "eval/",
            "lora/",
            "lora_ema/",  # else tools.export (EMA by default) exports the earlier run's EMA
            "metrics.jsonl",
            "metrics.csv",
            "eval_metrics.jsonl",
        ]
    )
    assert sorted(p.name for p in out.root.iterdir()) == ["config.yaml"]


def _checkpoint(out: OutputDir, step: int, *, complete: bool = True) -> Path:
    path = out.checkpoint(step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text("x")
    if complete:
        (path / DRIVER_STATE).write_text("{}")
    return path


def test_prune_keeps_the_newest_complete_checkpoints_and_removes_dead_writers_leftovers(
    tmp_path: Path,
) -> None:
    out = OutputDir(tmp_path / "run")
    for step in (2, 4, 6, 8):
        _checkpoint(out, step)
    _checkpoint(out, 10, complete=False)  # a run killed while writing it
    for leftover in ("step_000004.tmp-123", "step_000006.old-456"):
        (out.checkpoints / leftover).mkdir()
    for other in ("notes", "step_12"):  # not checkpoint folders: never touched
        (out.checkpoints / other).mkdir()

    assert out.prune_checkpoints(0, current=out.checkpoint(8)) == []  # 0 keeps every one
    assert len(list(out.checkpoints.iterdir())) == 9

    removed = out.prune_checkpoints(2, current=out.checkpoint(8))
    assert [p.name for p in removed] == [
        "step_000002",
        "step_000004",
        "step_000010",
        "step_000004.tmp-123",
        "step_000006.old-456",
    ]
    assert sorted(p.name for p in out.checkpoints.iterdir()) == [
        "notes",
        "step_000006",
        "step_000008",
        "step_12",
    ]


def test_prune_never_removes_the_checkpoint_just_written(tmp_path: Path) -> None:
    """Resumed from an older checkpoint: newer complete ones count among the newest, and the
    one just written stays although it is not among them."""
    out = OutputDir(tmp_path / "run")
    for step in (4, 6, 8):
        _checkpoint(out, step)
    current = _checkpoint(out, 5)
    removed = out.prune_checkpoints(1, current=current)
    assert [p.name for p in removed] == ["step_000004", "step_000006"]
    assert [p.name for p in out.checkpoint_folders()] == ["step_000005", "step_000008"]


class _Ops:
    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_text(str(extra))


def test_save_prunes_to_keep_last_after_driver_state_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = StageTrainer.__new__(StageTrainer)  # save() alone: no pool, no roles
    trainer.cfg = RunConfig(output_dir=str(tmp_path / "run"), keep_last=2)
    trainer.out = OutputDir(trainer.cfg.output_dir)
    trainer.data_source = SimpleNamespace(state_dict=lambda: {"epoch": 0})
    trainer.data = {"seed": 0, "reward": {"api_key": "sk-1"}}  # the recipe, as composed
    stack = SimpleNamespace(state=lambda: {})
    algorithm = SimpleNamespace(algorithm_state=lambda: {})
    trainer.stages = [Stage(track="diffusion", stack=stack, algorithm=algorithm, ops=_Ops())]
    for done in (10, 20, 30):
        trainer.save(done)
    assert [p.name for p in trainer.out.checkpoint_folders()] == ["step_000020", "step_000030"]
    assert all((p / DRIVER_STATE).is_file() for p in trainer.out.checkpoint_folders())
    state = json.loads((trainer.out.checkpoint(30) / DRIVER_STATE).read_text())
    assert state["config"]["seed"] == 0  # the recipe that wrote it, for a resume to compare
    assert state["config"]["reward"]["api_key"] != "sk-1"  # credentials redacted
    assert "keep_last=2: removed step_000010" in capsys.readouterr().out


def test_a_resume_with_another_recipe_names_the_changes_and_keeps_the_earlier_config(
    tmp_path: Path,
) -> None:
    """The recipe a checkpoint was written with is in its driver_state.json; a resume that
    changes it says what changed (how long it runs and how it resumes may change quietly) and
    keeps the earlier config.yaml, once: a failed attempt does not replace the kept copy."""
    out = OutputDir(tmp_path)
    first = {"num_rollouts": 4, "resume": None, "backend": {"optimizer": {"lr": 0.003}, "k": [1]}}
    out.write_config(first)
    ckpt = out.checkpoint(2)
    same = {**first, "num_rollouts": 8, "resume": "auto"}
    assert out.keep_config_before_resume(same, ckpt, first) is None
    assert not (tmp_path / "config.before_step_000002.yaml").exists()
    changed = {**same, "backend": {"optimizer": {"lr": 0.0005}}, "seed": 3}
    assert out.keep_config_before_resume(changed, ckpt, first) == (
        "[unirl] resume: this run's recipe differs from the one that wrote step_000002 "
        "(backend.k: [1] -> (absent); backend.optimizer.lr: 0.003 -> 0.0005; seed: (absent) -> 3)"
        "; the earlier config.yaml is kept as config.before_step_000002.yaml"
    )
    kept = tmp_path / "config.before_step_000002.yaml"
    assert kept.read_text() == (tmp_path / "config.yaml").read_text()
    out.write_config(changed)  # the failed attempt's recipe replaces config.yaml ...
    assert out.keep_config_before_resume(changed, ckpt, first) is not None
    assert "lr: 0.003" in kept.read_text()  # ... but not the kept one
    # an older checkpoint without the recorded recipe: compared with config.yaml
    assert out.keep_config_before_resume(changed, ckpt, None) is None


def test_a_refused_resume_leaves_config_yaml_as_the_checkpoints_recipe_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose weights do not fit is refused while it loads (after Ray started);
    config.yaml must still be the recipe that wrote the checkpoint, not the refused one."""
    import unirl.trainer.base as base

    out = OutputDir(tmp_path / "run")
    first = {"seed": 0, "backend": {"lora": {"rank": 8}}}
    out.write_config(first)
    before = (out.root / "config.yaml").read_text()
    ckpt = out.checkpoint(2)
    ckpt.mkdir(parents=True)
    trainer = StageTrainer.__new__(StageTrainer)
    trainer.cfg = RunConfig(output_dir=str(out.root), resume="auto")
    trainer.out = out
    trainer.data = {"seed": 0, "backend": {"lora": {"rank": 16}}}  # the refused recipe
    trainer.data_source = SimpleNamespace(load_state_dict=lambda state: None)
    trainer.eval_held_out = []
    trainer.stages = []
    trainer.place = lambda pool: None  # type: ignore[method-assign]
    monkeypatch.setattr(base, "resolve_resume", lambda cfg, out: ckpt)
    monkeypatch.setattr(base, "incompatible_resume", lambda *args: None)
    monkeypatch.setattr(
        StageTrainer, "_driver_state", staticmethod(lambda path: {"config": first, "data": {}})
    )
    trackers = SimpleNamespace(close=lambda: None, local=None)
    monkeypatch.setattr(base, "make_trackers", lambda *args: trackers)
    monkeypatch.setattr(base, "LocalTracker", lambda *args, **kwargs: None)
    monkeypatch.setattr(
        base,
        "DevicePool",
        lambda config: SimpleNamespace(shutdown=lambda: None, plan_rows=lambda: []),
    )

    def refuse(path: Path, state: dict[str, Any]) -> None:
        raise ConfigError("checkpoint step_000002 does not fit this model: lora_A 8 vs 16")

    trainer.resume = refuse  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="does not fit"):
        trainer._run(None)
    assert (out.root / "config.yaml").read_text() == before
