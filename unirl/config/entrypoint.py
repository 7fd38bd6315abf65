"""Which entrypoint runs a recipe: every recipe declares it (top-level ``entrypoint``), and an
entrypoint refuses, before anything else, a recipe that belongs to another one.

A recipe run under the wrong entrypoint used to pass ``dry_run`` and die later with an
``AttributeError`` that never named the right one. The key is the module a user runs
(``python -m unirl.train_diffusion``). A ``--config-dir`` recipe written before the key
existed is judged by its blocks (:func:`inferred_entrypoint`): a ``pe`` block is a prompt
enhancer's, a ``unified`` block a unified model's, ``ARSamplingParams`` a text recipe's, else a
diffusion recipe's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from unirl.config.require import ConfigError

Entrypoint = Literal[
    "unirl.train_diffusion", "unirl.train_vlm", "unirl.train_pe", "unirl.train_unified_model"
]
ENTRYPOINTS: tuple[str, ...] = (
    "unirl.train_diffusion",
    "unirl.train_vlm",
    "unirl.train_pe",
    "unirl.train_unified_model",
)
# the recipe folders of examples/ and the entrypoint their recipes belong to
ENTRYPOINT_OF_FOLDER = {
    "diffusion": "unirl.train_diffusion",
    "llm": "unirl.train_vlm",
    "vlm": "unirl.train_vlm",
    "pe": "unirl.train_pe",
    "unified_model": "unirl.train_unified_model",
}


def inferred_entrypoint(data: Mapping[str, object]) -> str:
    """The entrypoint a recipe's blocks belong to (for a recipe that declares none)."""
    if data.get("pe") is not None:
        return "unirl.train_pe"
    if data.get("unified") is not None:
        return "unirl.train_unified_model"
    sampling = data.get("sampling")
    target = str(sampling.get("_target_", "")) if isinstance(sampling, dict) else ""
    if target.rsplit(".", 1)[-1] == "ARSamplingParams":
        return "unirl.train_vlm"
    return "unirl.train_diffusion"


def check_entrypoint(data: Mapping[str, object], entry: str) -> None:
    """Refuse, in one line naming the right entrypoint, a recipe that ``entry`` cannot run:
    one that declares another ``entrypoint`` (or, declaring none, whose blocks are another
    entrypoint's). Runs first, before the recipe is validated (``dry_run`` included)."""
    declared = data.get("entrypoint")
    if declared is not None and declared not in ENTRYPOINTS:
        raise ConfigError(
            f"entrypoint={declared!r} is not an entrypoint; set it to the module that runs the "
            f"recipe, one of {', '.join(ENTRYPOINTS)}"
        )
    belongs = str(declared) if declared is not None else inferred_entrypoint(data)
    if belongs == entry:
        return
    why = (
        f"declares entrypoint: {belongs}"
        if declared is not None
        else f"declares no entrypoint and its blocks are a {belongs} recipe's"
    )
    raise ConfigError(
        f"this recipe belongs to {belongs} ({why}), not {entry}; run python -m {belongs} "
        "with the same --config-name and overrides"
    )
