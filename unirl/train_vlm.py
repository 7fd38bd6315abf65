"""``python -m unirl.train_vlm --config-name=llm/<recipe> [key=value ...]`` (``vlm/`` too)."""

from __future__ import annotations

from typing import Any

from unirl.config.entry import hydra_entry

DEFAULT_RECIPE = "llm/qwen3_tiny_grpo"
ENTRYPOINT = "unirl.train_vlm"


def check(data: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Every check before Ray (the recipe is this entrypoint's, the validators, what this
    trainer places); returns the ``RunConfig`` and the validators' objects."""
    from unirl.config.entrypoint import check_entrypoint
    from unirl.config.validate import validate
    from unirl.trainer.ar import check_ar_recipe

    check_entrypoint(data, ENTRYPOINT)
    cfg, objs = validate(data)
    check_ar_recipe(cfg, objs)
    return cfg, objs


def trainer(data: dict[str, Any], *, dry: bool = False) -> Any:
    """The validated recipe's trainer (``dry``: to plan only, writing nothing)."""
    from unirl.trainer.ar import ARTrainer

    cfg, _ = check(data)
    return ARTrainer(cfg, data, dry=dry)


def run(data: dict[str, Any]) -> int:
    """Validate the composed recipe before any Ray work; then dry-run or train."""
    from unirl.config.dry_run import print_dry_run
    from unirl.trainer.ar import ARTrainer, run_ar

    cfg, objs = check(data)
    if cfg.dry_run:
        print_dry_run(cfg, objs, ARTrainer(cfg, data, dry=True).planned())
        return 0
    return run_ar(cfg, data)


main = hydra_entry(DEFAULT_RECIPE, run)

if __name__ == "__main__":
    main()
