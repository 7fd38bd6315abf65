"""SD3's dialect on the external engines (``SD3Bundle.engine_maps``).

SGLang records the transformer's keyword arguments per sample: ``encoder_hidden_states
[L, D]`` and ``pooled_projections [Dp]`` under ``pos_cond_kwargs`` (and ``neg_cond_kwargs``
with CFG). vLLM-Omni takes the embeddings of diffusers' ``StableDiffusion3Pipeline``:
``prompt_embeds`` / ``negative_prompt_embeds`` in the prompt and the pooled ones under
``additional_information``. Latents are ``[C, h, w]`` on every side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from unirl.models.common.engine_maps import (
    Engine,
    EngineMapError,
    EngineMaps,
    PromptEntry,
    cond_kwargs,
    sample_tensor,
)
from unirl.models.sd3.conditions import SD3Conditions
from unirl.types import Conditions


class SD3EngineMaps(EngineMaps):
    """SGLang conditions and vLLM-Omni prompt kwargs of ``SD3Conditions``."""

    family: ClassVar[str] = "unirl.models.sd3.SD3Bundle"
    engines: ClassVar[tuple[Engine, ...]] = ("sglang", "vllm_omni")

    def sglang_conditions(self, envs: Sequence[Mapping[str, Any]]) -> SD3Conditions:
        """``SD3Conditions`` from ``pos_cond_kwargs`` / ``neg_cond_kwargs`` holding
        ``encoder_hidden_states [L, D]`` and ``pooled_projections [Dp]`` (no negatives on any
        sample: no CFG)."""

        def stacked(side: str, key: str, ndim: int) -> torch.Tensor | None:
            values = []
            for env in envs:
                kwargs = cond_kwargs(env, side)
                if key not in kwargs:
                    if side == "neg_cond_kwargs":
                        return None  # no CFG
                    raise EngineMapError(
                        f"denoising_env.{side} has no {key!r} (keys: {sorted(kwargs)}); training "
                        "replay needs the encoded conditions (rollout_return_denoising_env=true)"
                    )
                values.append(sample_tensor(kwargs[key], ndim, f"{side}.{key}"))
            return torch.stack(values)

        prompt_embeds = stacked("pos_cond_kwargs", "encoder_hidden_states", 2)
        pooled = stacked("pos_cond_kwargs", "pooled_projections", 1)
        assert prompt_embeds is not None and pooled is not None
        return SD3Conditions(
            prompt_embeds=prompt_embeds,
            pooled_prompt_embeds=pooled,
            negative_prompt_embeds=stacked("neg_cond_kwargs", "encoder_hidden_states", 2),
            negative_pooled_prompt_embeds=stacked("neg_cond_kwargs", "pooled_projections", 1),
        )

    def vllm_omni_prompt(self, conditions: Conditions, row: int) -> dict[str, PromptEntry]:
        """``prompt_embeds`` / ``negative_prompt_embeds`` ``[1, L, D]`` and, under
        ``additional_information``, the pooled ``[1, Dp]`` ones of row ``row``."""
        if not isinstance(conditions, SD3Conditions):
            raise EngineMapError(f"expected SD3Conditions, got {type(conditions).__name__}")
        one = slice(row, row + 1)
        neg = conditions.negative_prompt_embeds
        neg_pooled = conditions.negative_pooled_prompt_embeds
        return {
            "prompt_embeds": conditions.prompt_embeds[one],
            "negative_prompt_embeds": None if neg is None else neg[one],
            "additional_information": {
                "pooled_prompt_embeds": conditions.pooled_prompt_embeds[one],
                "negative_pooled_prompt_embeds": None if neg_pooled is None else neg_pooled[one],
            },
        }
