"""Every key a shipped recipe can set has a one-line description in ``--help`` and on the
configuration reference page (both read ``unirl.config.help``): the top-level ``RunConfig``
keys and the keys of every ``_target_`` the recipes in ``examples/`` use. A failure names
each undocumented key with the class that declares it (where its description belongs)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from unirl.config.component import config_class_of
from unirl.config.help import component_keys, field_docs, top_level_blocks
from unirl.config.run import RunConfig
from unirl.config.typecheck import annotations_of, config_class
from unirl.config.validate import locate
from unirl.tools.docs import recipe_targets


def _declares(cls: type, name: str) -> bool:
    if name in vars(cls).get("__annotations__", {}):
        return True
    if dataclasses.is_dataclass(cls):  # its generated __init__ repeats inherited fields
        return False
    init = vars(cls).get("__init__")
    try:
        return init is not None and name in inspect.signature(init).parameters
    except (TypeError, ValueError):
        return False


def _owner(target: Any, key: str) -> str:
    """The class that declares the last part of ``key`` (``lora.rank`` of ``FSDPBackend`` ->
    ``unirl.train.lora.LoraConfig``): nested config dataclasses are followed by annotation,
    then the config class's and the class's MRO searched for the declaration."""
    *path, name = key.split(".")
    cls = target
    for part in path:
        nested = config_class(annotations_of(cls).get(part))
        if nested is None:
            break
        cls = nested
    knobs = config_class_of(cls)
    candidates = [*(knobs.__mro__ if knobs else ()), *(cls.__mro__ if inspect.isclass(cls) else ())]
    owner = next((c for c in candidates if _declares(c, name)), cls)
    return f"{owner.__module__}.{owner.__qualname__}"


def _undocumented(target: Any, *, skip: tuple[str, ...] = ()) -> list[str]:
    return [
        k.key
        for k in component_keys("", target, None)
        if not k.key.endswith("._target_") and k.key.split(".")[0] not in skip and not k.doc
    ]


def _report(missing: dict[str, list[str]]) -> str:
    return "keys without a description (document each in the class named): " + "; ".join(
        f"{owner}: {', '.join(sorted(keys))}" for owner, keys in sorted(missing.items())
    )


def test_every_top_level_key_is_described() -> None:
    missing: dict[str, list[str]] = {}
    for key in _undocumented(RunConfig, skip=top_level_blocks()):
        missing.setdefault(_owner(RunConfig, key), []).append(key)
    assert missing == {}, _report(missing)


def test_every_key_of_every_recipe_target_is_described() -> None:
    targets = sorted(recipe_targets())
    assert len(targets) > 40  # the walk found the recipes' components
    missing: dict[str, list[str]] = {}
    for path in targets:
        target = locate(path, path)
        for key in _undocumented(target):
            keys = missing.setdefault(_owner(target, key), [])
            if key not in keys:
                keys.append(key)
    assert missing == {}, _report(missing)


def test_the_report_names_the_declaring_class() -> None:
    from unirl.train.backend import FSDPBackend

    assert _owner(FSDPBackend, "lora.rank") == "unirl.train.lora.LoraConfig"
    assert _owner(FSDPBackend, "seed") == "unirl.train.backend.FSDPBackend"
    assert _owner(RunConfig, "eval.seed") == "unirl.config.run.EvalConfig"


def test_a_field_docstring_wins_over_the_class_clause() -> None:
    from unirl.train.optim import OptimizerConfig

    docs = field_docs(OptimizerConfig)
    assert docs["lr"] == "Peak learning rate (lr_schedule multiplies it)."
    assert docs["betas"].startswith("AdamW's moment decay rates")
