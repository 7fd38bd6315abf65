"""``python -m unirl.train_pe --config-name=pe/<recipe> [key=value ...]``: a prompt enhancer
(an AR policy rewrites each prompt, a diffusion model draws the rewrites, the image reward
trains the policy; ``pe.train_both=true`` trains the drawer too). The policy samples its own
rewrites (``rollout: ComposedEngine``) or is served by SGLang (``rollout: SGLangLLMEngine``
with a ``sync`` block)."""

from __future__ import annotations

from typing import Any

from unirl.config.entry import hydra_entry

DEFAULT_RECIPE = "pe/pe_tiny_trainside"
ENTRYPOINT = "unirl.train_pe"


def check(data: dict[str, Any]) -> tuple[Any, ...]:
    """Every check before Ray: the recipe is this entrypoint's, the engine, the policy's
    blocks, then the ``pe`` block and the drawer's. Returns ``(cfg, objs, pe, drawer_cfg,
    drawer_objs)``."""
    from unirl.config.entrypoint import check_entrypoint
    from unirl.config.validate import validate
    from unirl.trainer.pe_config import check_pe_engine, check_pe_recipe

    check_entrypoint(data, ENTRYPOINT)
    check_pe_engine(data)  # trainside ComposedEngine or a served policy, before anything else
    cfg, objs = validate(data)
    pe, drawer_cfg, drawer_objs = check_pe_recipe(cfg, data, objs)
    return cfg, objs, pe, drawer_cfg, drawer_objs


def trainer(data: dict[str, Any], *, dry: bool = False) -> Any:
    """The validated recipe's trainer (``dry``: to plan only, writing nothing)."""
    from unirl.trainer.pe import PETrainer

    cfg, _, pe, _, _ = check(data)
    return PETrainer(cfg, data, pe, dry=dry)


def run(data: dict[str, Any]) -> int:
    """Validate the composed recipe (the policy's blocks, then the ``pe`` block and the
    drawer's) before any Ray work; then dry-run or train."""
    from unirl.config.dry_run import print_dry_run, print_section
    from unirl.trainer.pe import PETrainer, run_pe
    from unirl.trainer.pe_config import drawer_summary

    cfg, objs, pe, drawer_cfg, drawer_objs = check(data)
    if cfg.dry_run:
        print_dry_run(cfg, objs, PETrainer(cfg, data, pe, dry=True).planned())
        print_section("drawer (pe.diffusion)", drawer_summary(pe, drawer_cfg, drawer_objs))
        return 0
    return run_pe(cfg, data, pe)


main = hydra_entry(DEFAULT_RECIPE, run)

if __name__ == "__main__":
    main()
