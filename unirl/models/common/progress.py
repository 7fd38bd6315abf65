"""Silence Hugging Face progress bars around bulk loads and saves of many small modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def hf_progress_bars_disabled() -> Iterator[None]:
    """Turn off transformers' and diffusers' tqdm bars inside the block, restoring them after."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    restore = []
    for lib in (transformers_logging, diffusers_logging):
        if lib.is_progress_bar_enabled():
            lib.disable_progress_bar()
            restore.append(lib)
    try:
        yield
    finally:
        for lib in restore:
            lib.enable_progress_bar()
