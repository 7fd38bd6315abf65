"""``python -m unirl.train_unified_model --config-name=unified_model/<recipe> [key=value ...]``:
a unified model (one transformer writes a "think / recaption" text, then draws an image
conditioned on it; GRPO on the text and Flow-GRPO on the image, one optimizer step)."""

from __future__ import annotations

from typing import Any

from unirl.config.entry import hydra_entry

DEFAULT_RECIPE = "unified_model/unified_tiny"
ENTRYPOINT = "unirl.train_unified_model"


def check(data: dict[str, Any]) -> tuple[Any, ...]:
    """Every check before Ray: the recipe is this entrypoint's, the text stage's blocks, then
    the ``unified`` block and the image stage's. Returns ``(cfg, objs, unified, sampling)``."""
    from unirl.config.entrypoint import check_entrypoint
    from unirl.config.validate import validate
    from unirl.trainer.unified_model import check_unified_recipe

    check_entrypoint(data, ENTRYPOINT)
    cfg, objs = validate(data)
    unified, sampling = check_unified_recipe(cfg, objs)
    return cfg, objs, unified, sampling


def trainer(data: dict[str, Any], *, dry: bool = False) -> Any:
    """The validated recipe's trainer (``dry``: to plan only, writing nothing)."""
    from unirl.trainer.unified_model import UnifiedModelTrainer

    cfg, _, unified, _ = check(data)
    return UnifiedModelTrainer(cfg, data, unified, dry=dry)


def run(data: dict[str, Any]) -> int:
    """Validate the composed recipe (the text stage's blocks, then the ``unified`` block and
    the image stage's) before any Ray work; then dry-run or train."""
    from unirl.config.dry_run import print_dry_run, print_section
    from unirl.trainer.unified_model import (
        UnifiedModelTrainer,
        check_trainable_here,
        image_summary,
        run_unified,
    )

    cfg, objs, unified, sampling = check(data)
    if cfg.dry_run:
        print_dry_run(cfg, objs, UnifiedModelTrainer(cfg, data, unified, dry=True).planned())
        print_section(
            "image stage (unified.image) and the joint loss", image_summary(cfg, objs, sampling)
        )
        return 0
    check_trainable_here(cfg)
    return run_unified(cfg, data, unified)


main = hydra_entry(DEFAULT_RECIPE, run)

if __name__ == "__main__":
    main()
