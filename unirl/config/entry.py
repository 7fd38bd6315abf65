"""Entrypoint machinery shared by the domain mains (``unirl.train_diffusion`` …).

Recipes live in ``<repo>/examples/<domain>/<name>.yaml`` and are addressed as
``--config-name=<domain>/<name>`` from any working directory. Every recipe starts with
``# @package _global_`` and ``defaults: [/unirl_run, _self_]``: the ``unirl_run`` node (built
from ``RunConfig``'s defaults) declares every top-level key, so ``dry_run=true`` or
``resume=...`` overrides work on any recipe while a misspelt override fails in Hydra.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unirl.config.require import ConfigError, UserFacingError
from unirl.config.run import RunConfig

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

# Hydra writes nothing by itself: the trainer owns output_dir (resolved config, logs).
_HYDRA_DEFAULT_ARGS = (
    ("hydra.run.dir=", "hydra.run.dir=."),
    ("hydra.output_subdir=", "hydra.output_subdir=null"),
    ("hydra/job_logging=", "hydra/job_logging=none"),
    ("hydra/hydra_logging=", "hydra/hydra_logging=none"),
)


def run_defaults() -> dict[str, Any]:
    """Every top-level key with its ``RunConfig`` default (component blocks ``None``)."""
    return dataclasses.asdict(RunConfig())


def register_run_defaults() -> None:
    """The ``unirl_run`` defaults node and the ``${unirl_root:}`` resolver (the repo root, so
    recipes can name bundled files whatever the working directory)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="unirl_run", node=run_defaults(), package="_global_")
    if not OmegaConf.has_resolver("unirl_root"):
        OmegaConf.register_new_resolver("unirl_root", lambda: str(EXAMPLES_DIR.parent))
    if not OmegaConf.has_resolver("mul"):  # batch geometry scaled by num_devices
        OmegaConf.register_new_resolver("mul", lambda *xs: math.prod(int(x) for x in xs))


def examples_dir() -> Path:
    if not EXAMPLES_DIR.is_dir():
        raise FileNotFoundError(
            f"recipe folder {EXAMPLES_DIR} not found; install UniRL editable from a clone "
            "(pip install -e .) so the examples/ tree is next to the package"
        )
    return EXAMPLES_DIR


def compose_recipe(name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose recipe ``<domain>/<name>`` with ``overrides`` exactly as the entrypoints do
    (same search path and ``unirl_run`` defaults), resolved to a plain dict."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_run_defaults()
    with initialize_config_dir(config_dir=str(examples_dir()), version_base=None):
        cfg = compose(config_name=name, overrides=list(overrides or []))
    data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(data, dict)
    return data  # type: ignore[return-value]


def hydra_entry(
    default_config: str, run: Callable[[dict[str, Any]], int | None]
) -> Callable[[], None]:
    """A Hydra main for one domain: composes the recipe, resolves it and calls ``run``."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    register_run_defaults()

    @hydra.main(config_path=str(examples_dir()), config_name=default_config, version_base=None)
    def _main(cfg: DictConfig) -> None:
        try:
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
            assert isinstance(data, dict)
            code = run(data)  # type: ignore[arg-type]
        except ConfigError as exc:
            print(f"[unirl] configuration error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        except UserFacingError as exc:  # a refused resume, a model path that resolves to nothing
            print(f"[unirl] error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)
        if code:
            sys.exit(code)

    def main() -> None:
        given = sys.argv[1:]
        extra = [
            arg
            for prefix, arg in _HYDRA_DEFAULT_ARGS
            if not any(a.startswith(prefix) for a in given)
        ]
        sys.argv = [sys.argv[0], *given, *extra]
        os.environ.setdefault("HYDRA_FULL_ERROR", "0")
        _main()

    return main
