"""Recipe values against annotations: what is refused, with which message, and what passes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import pytest

from unirl.config import ConfigError
from unirl.config.typecheck import (
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    annotations_of,
    check_fields,
    check_value,
    config_class,
)
from unirl.types import DiffusionSamplingParams


@pytest.mark.parametrize(
    ("value", "annotation", "message"),
    [
        ("no", bool, r"x must be true or false, got 'no' \(write true or false, not 'no'\)"),
        (1, bool, r"x must be true or false, got 1$"),
        ("1e-4", float, r"got '1e-4' \(the string '1e-4' is not a number: write it with a dot"),
        (8.0, int, r"x must be an integer, got 8.0 \(write 8, without a decimal point\)"),
        (True, int, r"x must be an integer, got True"),
        (0, PositiveInt, r"x must be an integer >= 1, got 0$"),
        (0.0, PositiveFloat, r"x must be a finite number > 0, got 0.0"),
        (math.nan, NonNegativeFloat, r"x must be a finite number >= 0, got nan"),
        (math.inf, PositiveFloat, r"got inf"),
        (
            "gpu",
            Literal["cpu", "cuda"] | None,
            r"x must be one of 'cpu', 'cuda' or null, got 'gpu'",
        ),
        ([1, "a"], list[int], r"x must be a list, got \[1, 'a'\]"),
        ({"a": "b"}, dict[str, float], r"x must be a dict"),
    ],
)
def test_refused_values_name_the_key_and_the_fix(value, annotation, message) -> None:
    with pytest.raises(ConfigError, match=message):
        check_value(value, annotation, "x")


def test_accepted_values_and_the_one_coercion() -> None:
    assert check_value(3, float, "x") == 3.0 and isinstance(check_value(3, float, "x"), float)
    assert check_value(None, PositiveInt | None, "x") is None
    assert check_value("cuda", Literal["cpu", "cuda"], "x") == "cuda"
    assert check_value(False, bool, "x") is False
    assert check_value([1, 2], list[int], "x") == [1, 2]
    # a nested component block is checked as a block of its own
    assert check_value({"_target_": "a.B"}, int, "x") == {"_target_": "a.B"}
    # 1 == True in Python, so a Literal of strings must not take a bool or int by equality
    with pytest.raises(ConfigError):
        check_value(True, Literal[1, "a"], "x")


def test_annotations_of_components_resolve_literals_and_bounds() -> None:
    from unirl.algorithms import FlowGRPO, KLConfig
    from unirl.train import TrainStack

    hints = annotations_of(FlowGRPO)
    assert hints["clip_range"] == PositiveFloat and config_class(hints["kl"]) is KLConfig
    assert annotations_of(KLConfig)["beta"] == NonNegativeFloat
    assert "pipeline" in hints
    assert annotations_of(TrainStack)["micro_batch_size"] == PositiveInt
    out = check_fields({"clip_range": 1, "unknown": "kept"}, FlowGRPO, "algorithm")
    assert out == {"clip_range": 1.0, "unknown": "kept"}


def test_a_mapping_for_a_config_dataclass_is_checked_key_by_key() -> None:
    """``algorithm.kl={beta: ...}`` without ``_target_`` keeps the typed check of KLConfig."""
    from unirl.algorithms import KLConfig

    annotation = KLConfig | Mapping[str, Any] | None
    assert config_class(annotation) is KLConfig and config_class(Mapping[str, Any]) is None
    assert check_value({"beta": 1}, annotation, "algorithm.kl") == {"beta": 1.0}
    with pytest.raises(
        ConfigError, match=r"^algorithm\.kl\.beta must be a finite number >= 0, got -1$"
    ):
        check_value({"beta": -1}, annotation, "algorithm.kl")
    with pytest.raises(
        ConfigError, match=r"^algorithm\.kl: unknown key\(s\) \['betta'\] for KLConfig"
    ):
        check_value({"betta": 0.1}, annotation, "algorithm.kl")


def test_eval_guidance_scale_zero_is_honoured() -> None:
    """``eval_guidance_scale: 0`` disables CFG at eval; it used to fall back through an ``or``."""
    params = DiffusionSamplingParams(guidance_scale=4.5, eval_guidance_scale=0.0)
    assert params.guidance_for("eval") == 0.0
    assert params.guidance_for("train") == 4.5
    assert DiffusionSamplingParams(guidance_scale=4.5).guidance_for("eval") == 4.5
