"""Every key a shipped recipe can set has a one-line description in ``--help`` and on the
configuration reference page (both read ``unirl.config.help``): the top-level ``RunConfig``
keys and the keys of every ``_target_`` the recipes in ``examples/`` use."""

from __future__ import annotations

from unirl.config.help import component_keys, field_docs, top_level_blocks
from unirl.config.run import RunConfig
from unirl.config.validate import locate
from unirl.tools.docs import recipe_targets


def _undocumented(target: object, *, skip: tuple[str, ...] = ()) -> list[str]:
    return [
        k.key
        for k in component_keys("", target, None)
        if not k.key.endswith("._target_") and k.key.split(".")[0] not in skip and not k.doc
    ]


def test_every_top_level_key_is_described() -> None:
    missing = _undocumented(RunConfig, skip=top_level_blocks())
    assert missing == [], f"RunConfig keys without a description: {missing}"


def test_every_key_of_every_recipe_target_is_described() -> None:
    targets = sorted(recipe_targets())
    assert len(targets) > 40  # the walk found the recipes' components
    missing = {}
    for target in targets:
        keys = _undocumented(locate(target, target))
        if keys:
            missing[target] = keys
    assert missing == {}, "keys without a description (document them in the owning class): " + (
        "; ".join(f"{t}: {', '.join(k)}" for t, k in missing.items())
    )


def test_a_field_docstring_wins_over_the_class_clause() -> None:
    from unirl.train.optim import OptimizerConfig

    docs = field_docs(OptimizerConfig)
    assert docs["lr"] == "Peak learning rate (lr_schedule multiplies it)."
    assert docs["betas"].startswith("AdamW's moment decay rates")
