"""``python -m unirl.train_diffusion --config-name=diffusion/<recipe> [key=value ...]``."""

from __future__ import annotations

from typing import Any

from unirl.config.entry import hydra_entry

DEFAULT_RECIPE = "diffusion/sd3_tiny_trainside"
ENTRYPOINT = "unirl.train_diffusion"


def check(data: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Every check before Ray (the recipe is this entrypoint's, the validators, the editing
    inputs); returns the ``RunConfig`` and the validators' objects."""
    from unirl.config.entrypoint import check_entrypoint
    from unirl.config.validate import validate
    from unirl.trainer.diffusion import check_diffusion_recipe

    check_entrypoint(data, ENTRYPOINT)
    cfg, objs = validate(data)
    check_diffusion_recipe(cfg, objs)
    return cfg, objs


def trainer(data: dict[str, Any], *, dry: bool = False) -> Any:
    """The validated recipe's trainer (``dry``: to plan only, writing nothing)."""
    from unirl.trainer.diffusion import DiffusionTrainer

    cfg, _ = check(data)
    return DiffusionTrainer(cfg, data, dry=dry)


def run(data: dict[str, Any]) -> int:
    """Validate the composed recipe before any Ray work; then dry-run or train."""
    from unirl.config.dry_run import print_dry_run
    from unirl.trainer.diffusion import DiffusionTrainer, run_diffusion

    cfg, objs = check(data)
    if cfg.dry_run:
        print_dry_run(cfg, objs, DiffusionTrainer(cfg, data, dry=True).planned())
        return 0
    return run_diffusion(cfg, data)


main = hydra_entry(DEFAULT_RECIPE, run)

if __name__ == "__main__":
    main()
