"""Silence Hugging Face progress bars around bulk loads and saves of many small modules, and
its warnings where they are known to be unrelated to what the block does."""

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


@contextlib.contextmanager
def hf_warnings_off() -> Iterator[None]:
    """transformers' and diffusers' loggers at ``error`` inside the block, restored after: for
    warnings that do not concern the block (importing ``StableDiffusion3Pipeline`` touches its
    optional IP-adapter image processors, and transformers then says torchvision is missing;
    fusing a transformer-only LoRA says the text encoders got no LoRA keys). Errors still
    print."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    levels = [(lib, lib.get_verbosity()) for lib in (transformers_logging, diffusers_logging)]
    for lib, _ in levels:
        lib.set_verbosity_error()
    try:
        yield
    finally:
        for lib, level in levels:
            lib.set_verbosity(level)
