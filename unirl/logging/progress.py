"""Progress bars in a terminal, silence in CI and pipes."""

from __future__ import annotations

import os
import sys
from typing import Any


def progress_enabled(mode: str) -> bool:
    if mode == "on":
        return True
    if mode == "off":
        return False
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress_bar(total: int, *, initial: int, mode: str, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        disable=not progress_enabled(mode),
        dynamic_ncols=True,
    )
