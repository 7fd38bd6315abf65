"""``python -m unirl.train_vlm --config-name=llm/<recipe> [key=value ...]`` (``vlm/`` too)."""

from __future__ import annotations

from typing import Any

from unirl.config.entry import hydra_entry

DEFAULT_RECIPE = "llm/qwen3_tiny_grpo"


def run(data: dict[str, Any]) -> int:
    """Validate the composed recipe before any Ray work; then dry-run or train."""
    from unirl.config.dry_run import print_dry_run
    from unirl.config.validate import validate
    from unirl.trainer.ar import check_ar_recipe, plan_roles, run_ar

    cfg, objs = validate(data)
    check_ar_recipe(cfg)
    if cfg.dry_run:
        print_dry_run(cfg, objs, plan_roles(cfg))
        return 0
    return run_ar(cfg, data)


main = hydra_entry(DEFAULT_RECIPE, run)

if __name__ == "__main__":
    main()
