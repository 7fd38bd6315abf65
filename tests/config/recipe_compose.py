from __future__ import annotations

from typing import Any

from unirl.config.entry import examples_dir, register_run_defaults


def compose_recipe(name: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Compose ``<domain>/<name>`` exactly as the entrypoints do, resolved to a plain dict."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_run_defaults()
    with initialize_config_dir(config_dir=str(examples_dir()), version_base=None):
        cfg = compose(config_name=name, overrides=overrides or [])
    data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(data, dict)
    return data
