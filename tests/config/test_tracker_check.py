"""An optional tracker whose package is missing is refused by validation, in one line with the
install command, before the run's folder is written (it failed inside the run, exit 1)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from unirl.config.entry import compose_recipe
from unirl.config.require import ConfigError
from unirl.config.validate import validate

RECIPE = "diffusion/sd3_tiny_trainside"


def test_a_tracker_without_its_package_is_refused_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    missing = {"wandb", "tensorboard"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a)
    )
    for tracker in ("wandb", "tensorboard"):
        data = compose_recipe(
            RECIPE, [f"output_dir={tmp_path / 'run'}", f"logging.trackers=[local,{tracker}]"]
        )
        with pytest.raises(ConfigError) as info:
            validate(data)
        assert str(info.value) == (
            f"logging.trackers has {tracker!r} but the {tracker} package is not installed: "
            f"pip install 'unirl-mm[{tracker}]', or drop {tracker!r} from logging.trackers"
        )
    assert not (tmp_path / "run").exists()
    missing.clear()  # installed: accepted
    data = compose_recipe(
        RECIPE, [f"output_dir={tmp_path / 'run'}", "logging.trackers=[local,tensorboard]"]
    )
    if real("tensorboard") is not None:
        validate(data)
