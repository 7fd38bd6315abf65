"""Ship the recipes and the small datasets inside the wheel.

A wheel (``pip install unirl-mm``, or ``pip wheel .``) carries ``examples/`` and ``datasets/``
under ``unirl/_bundled/``, where ``unirl.config.entry`` finds them when the package is not
running from a clone; an editable install (``pip install -e .``) reads them from the clone and
copies nothing. Everything else about the distribution is in ``pyproject.toml``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = ("examples", "datasets")  # copied whole, as the clone has them
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "outputs")


class BuildWithRecipes(build_py):
    """``build_py`` plus the copy of :data:`BUNDLED` into ``<build>/unirl/_bundled/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the clone is the source: nothing to copy
        target = Path(self.build_lib) / "unirl" / "_bundled"
        for name in BUNDLED:
            shutil.copytree(ROOT / name, target / name, ignore=SKIP, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithRecipes})
