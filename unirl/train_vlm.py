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
    check_eval_images(cfg)
    return cfg, objs


def check_eval_images(cfg: Any) -> None:
    """The eval file is of the training file's kind: a vision-language family reads one image
    per prompt in eval too (``check_ar_recipe`` requires it of ``data_source.path``), a text
    family none; refused before Ray instead of at the first eval."""
    from unirl.config import require
    from unirl.data import read_prompt_file
    from unirl.data.media import has_references
    from unirl.trainer.ar import bundle_image_size

    path = cfg.eval.prompts_path
    if not path:
        return
    with_images = has_references(read_prompt_file(path))
    family = (cfg.bundle or {}).get("_target_")
    if bundle_image_size(cfg) is not None:
        require(
            with_images,
            f"eval.prompts_path {path!r} has no images, but {family} reads one image per prompt; "
            "give every eval line a media image (datasets/geometry/test.jsonl shows the format), "
            "or eval.prompts_path=null to hold out prompts of the training file",
        )
    else:
        require(
            not with_images,
            f"eval.prompts_path {path!r} gives every prompt an image, but {family} reads no "
            "images; use a text eval file or a vision-language family",
        )


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
