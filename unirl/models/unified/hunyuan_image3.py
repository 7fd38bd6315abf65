"""``HunyuanImage3Bundle``: the ``bundle:`` block of a recipe that samples HunyuanImage-3.0
through vLLM-Omni (``unirl.rollout.engine.vllm_omni.hi3.Hi3OmniEngine``).

HunyuanImage-3.0 (an 80B mixture-of-experts, 64 experts, ~13B active per token) is not in
transformers or diffusers, and its weights and modeling code cannot be fetched here. The
rollout side of such a recipe is the vLLM-Omni adapter (contract-tested against a fake
server); the trainer side, the module that replays its text and image log-probs under FSDP +
expert parallelism, is NOT built. This class is the recipe's typed description of the served
model (validated by ``dry_run`` like every bundle block), and refuses to be built for
training, naming what is missing, before any Ray work (``trainable_here = False``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from torch import nn

from unirl.config.require import ConfigError, require
from unirl.models.common_ar.config import CausalLMBundleConfig

NOT_BUILT = (
    "bundle._target_=unirl.models.unified.HunyuanImage3Bundle: the trainer side of "
    "HunyuanImage-3.0 (replaying its text and image log-probs under FSDP + expert parallelism) "
    "is not built; dry_run=true checks the recipe and prints its plan, and the vLLM-Omni "
    "rollout adapter (Hi3OmniEngine) is contract-tested only. Train the tiny unified model "
    "instead: --config-name=unified_model/unified_tiny"
)


@dataclasses.dataclass(kw_only=True)
class HunyuanImage3BundleConfig(CausalLMBundleConfig):
    """Every field of :class:`CausalLMBundleConfig`; ``path`` is a hub id or a local folder
    of HunyuanImage-3.0 (``tencent/HunyuanImage-3.0``); ``mode``: ``think`` | ``recaption``
    (what the model writes before drawing; the rollout's ``mode`` must agree)."""

    preset_names: ClassVar[tuple[str, ...]] = ()

    path: str = "tencent/HunyuanImage-3.0"
    dtype: str = "bf16"
    mode: Literal["think", "recaption"] = "think"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.mode in ("think", "recaption"),
            f"bundle.mode={self.mode!r} must be 'think' or 'recaption'",
        )


class HunyuanImage3Bundle:
    """HunyuanImage-3.0 as a recipe's ``bundle`` (see the module docstring): validated, never
    built here."""

    config_class: ClassVar[type[HunyuanImage3BundleConfig]] = HunyuanImage3BundleConfig
    trainable_here: ClassVar[bool] = False
    not_built: ClassVar[str] = NOT_BUILT
    trainable_attr: ClassVar[str] = "model"

    def __init__(self, **knobs: Any) -> None:
        self.config = self.config_class(**knobs)
        raise ConfigError(NOT_BUILT)

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """The block's fields type-check (``config_class``); the mode agrees with the
        rollout's. No weights are read."""
        # the recipe's values, typed by the config class that takes them
        knobs: dict[str, Any] = {k: v for k, v in block.items() if not str(k).startswith("_")}
        config = cls.config_class(**knobs)
        rollout = getattr(recipe, "rollout", None) or {}
        mode = rollout.get("mode") if isinstance(rollout, dict) else None
        require(
            mode is None or mode == config.mode,
            f"bundle.mode={config.mode!r} but rollout.mode={mode!r}; set one mode for both",
        )

    @classmethod
    def trainable_on_meta(cls, block: Mapping[str, object]) -> nn.Module | None:
        return None  # no modeling code here: LoRA targets are checked when it is built
