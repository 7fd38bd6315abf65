"""``run.json`` in the output folder: the run's status, start, wall time and code version,
which ``report.html`` shows (``unirl.logging.report.run_info``).

Written when a run has passed its checks and starts (``running``), and at its end
(``finished``, ``stopped`` by a signal, or ``failed``). A resumed run keeps the first start and
adds its own time to ``wall_s``. Each write is whole (``write_json_atomic``).
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

RUN_INFO = "run.json"


def code_version() -> str:
    """The git commit of the source the package runs from (``-dirty`` with uncommitted
    changes), or the installed distribution's version when it is not a checkout."""
    package = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(package), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return f"{commit}-dirty" if dirty else commit
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"unirl-mm {version('unirl-mm')}"
        except PackageNotFoundError:
            return "unknown"


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


class RunInfo:
    """The run's ``run.json``: :meth:`begin` when the loop starts, :meth:`end` at its end."""

    def __init__(self, root: Path, *, resumed: bool) -> None:
        from unirl.trainer.output import write_json_atomic

        self.path = root / RUN_INFO
        self._write = write_json_atomic
        earlier: dict[str, Any] = {}
        if resumed and self.path.is_file():
            earlier = json.loads(self.path.read_text())
        self.before = float(earlier.get("wall_s", 0.0))
        self.t0 = time.monotonic()
        self.info: dict[str, Any] = {
            "status": "running",
            "started": earlier.get("started", _now()),
            "resumed": resumed,
            "ended": None,
            "wall_s": self.before,
            "commit": code_version(),
        }
        self._write(self.path, self.info)

    def end(self, status: str) -> None:
        self.info.update(
            status=status,
            ended=_now(),
            wall_s=round(self.before + time.monotonic() - self.t0, 3),
        )
        self._write(self.path, self.info)
