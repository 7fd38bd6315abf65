"""Shared fixtures for the model-family tests: the tiny SD3 preset, built once per machine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_sd3_path() -> Path:
    """The cached ``tiny`` preset folder (``$UNIRL_CACHE`` or ``~/.cache/unirl``)."""
    from unirl.models.sd3 import tiny_preset_path

    return tiny_preset_path()


@pytest.fixture(scope="session")
def make_tiny_sd3(tiny_sd3_path: Path) -> Callable[..., Any]:
    """Factory of fresh fp32 CPU bundles of the tiny preset (~0.1 s each once cached)."""
    from unirl.models.sd3 import SD3Bundle

    def make(**overrides: Any) -> SD3Bundle:
        kwargs: dict[str, Any] = {
            "path": "tiny",
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
        }
        kwargs.update(overrides)
        return SD3Bundle(**kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_sd3_bundle(make_tiny_sd3: Callable[..., Any]) -> Any:
    """A shared tiny bundle; tests that modify modules build their own with ``make_tiny_sd3``."""
    return make_tiny_sd3()


@pytest.fixture(scope="session")
def tiny_sd3_diffusers_pipe(tiny_sd3_path: Path) -> Any:
    """The tiny folder loaded by diffusers itself (the reference the bundle must match)."""
    from diffusers import StableDiffusion3Pipeline

    from unirl.models.sd3.progress import hf_progress_bars_disabled

    with hf_progress_bars_disabled():
        pipe = StableDiffusion3Pipeline.from_pretrained(tiny_sd3_path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe
