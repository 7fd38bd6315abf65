"""Qwen-Image's dialect on the external engines (``QwenImageBundle.engine_maps``).

The data is what diffusers' ``QwenImagePipeline`` passes its transformer: ``prompt_embeds
[L, D]`` with ``prompt_embeds_mask [L]`` (1 = token), the negative prompt's own of length
``L'``, and no pooled projections. SGLang records them per sample as the transformer's
``encoder_hidden_states`` (a tensor or a one-element list) and ``encoder_hidden_states_mask``
(None when every token is real) under ``pos_cond_kwargs`` / ``neg_cond_kwargs``; vLLM-Omni
takes ``prompt_embeds`` / ``negative_prompt_embeds`` and their masks, and its CFG knob is
``true_cfg_scale``. Both engines carry latents packed as diffusers does, ``[h·w, 4·C]``: our
``[h, w, 4·C]`` is the same elements (``reshape``), so pinning x_T and reading trajectories
back is a reshape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from unirl.models.common.config_dict import JSONDict
from unirl.models.common.engine_maps import (
    Engine,
    EngineMapError,
    PackedLatentEngineMaps,
    PromptEntry,
    cond_kwargs,
    sample_tensor,
)
from unirl.models.qwen_image.conditions import QwenImageConditions
from unirl.types import Conditions


def _mask(value: object, length: int, what: str) -> torch.Tensor | None:
    """``mask[1, L]`` (long 0/1) of one sample; None when absent."""
    if value is None or (isinstance(value, list | tuple) and value and value[0] is None):
        return None
    mask = sample_tensor(value, 1, what).long()
    if mask.numel() != length:
        raise EngineMapError(f"{what} has {mask.numel()} entries for {length} tokens")
    return mask[None]


def _ones_if_none(mask: torch.Tensor | None, embeds: torch.Tensor) -> torch.Tensor:
    if mask is not None:
        return mask
    return torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)


class QwenImageEngineMaps(PackedLatentEngineMaps):
    """SGLang conditions, vLLM-Omni prompt kwargs and the packed latent layout of Qwen-Image."""

    family: ClassVar[str] = "unirl.models.qwen_image.QwenImageBundle"
    engines: ClassVar[tuple[Engine, ...]] = ("sglang", "vllm_omni")

    def sglang_conditions(self, envs: Sequence[Mapping[str, Any]]) -> QwenImageConditions:
        """``QwenImageConditions`` with rows right-padded to the longest prompt (masks mark the
        padding); negatives only when every sample has them."""
        with_negative = all(
            "encoder_hidden_states" in cond_kwargs(env, "neg_cond_kwargs") for env in envs
        )
        rows = []
        for env in envs:
            pos = cond_kwargs(env, "pos_cond_kwargs")
            if "encoder_hidden_states" not in pos:
                raise EngineMapError(
                    f"denoising_env.pos_cond_kwargs has no 'encoder_hidden_states' (keys: "
                    f"{sorted(pos)}); training replay needs the encoded conditions "
                    "(rollout_return_denoising_env=true)"
                )
            embeds = sample_tensor(pos["encoder_hidden_states"], 2, "pos encoder_hidden_states")
            fields: dict[str, Any] = {
                "prompt_embeds": embeds[None],
                "prompt_mask": _mask(
                    pos.get("encoder_hidden_states_mask"), embeds.shape[0], "pos mask"
                ),
            }
            if with_negative:
                neg = cond_kwargs(env, "neg_cond_kwargs")
                neg_embeds = sample_tensor(
                    neg["encoder_hidden_states"], 2, "neg encoder_hidden_states"
                )
                fields["negative_prompt_embeds"] = neg_embeds[None]
                fields["negative_prompt_mask"] = _mask(
                    neg.get("encoder_hidden_states_mask"), neg_embeds.shape[0], "neg mask"
                )
            rows.append(QwenImageConditions(**fields))
        return QwenImageConditions.concat(rows)

    def vllm_omni_prompt(self, conditions: Conditions, row: int) -> dict[str, PromptEntry]:
        """``prompt_embeds`` / ``negative_prompt_embeds`` ``[1, L, D]`` of row ``row`` and,
        under ``additional_information``, their ``[1, L]`` masks (explicit ones: vLLM-Omni's
        pipeline slices the mask it is given)."""
        if not isinstance(conditions, QwenImageConditions):
            raise EngineMapError(f"expected QwenImageConditions, got {type(conditions).__name__}")
        one = slice(row, row + 1)
        embeds = conditions.prompt_embeds[one]
        mask = _ones_if_none(
            None if conditions.prompt_mask is None else conditions.prompt_mask[one], embeds
        )
        neg = conditions.negative_prompt_embeds
        neg_embeds = None if neg is None else neg[one]
        neg_mask = None
        if neg_embeds is not None:
            raw = conditions.negative_prompt_mask
            neg_mask = _ones_if_none(None if raw is None else raw[one], neg_embeds)
        return {
            "prompt_embeds": embeds,
            "negative_prompt_embeds": neg_embeds,
            "additional_information": {
                "prompt_embeds_mask": mask,
                "negative_prompt_embeds_mask": neg_mask,
            },
        }

    def vllm_omni_guidance(self, scale: float) -> JSONDict:
        """Qwen-Image's CFG is ``true_cfg_scale`` (``guidance_scale`` feeds only
        guidance-distilled checkpoints)."""
        return {"true_cfg_scale": scale}
