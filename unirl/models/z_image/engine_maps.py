"""Z-Image's dialect on the external engines (``ZImageBundle.engine_maps``): SGLang only.

**SGLang** (``sglang.multimodal_gen``, ``ZImagePipelineConfig``) encodes a prompt as the
pipeline does (chat turn, padding to 512, second-to-last Qwen3 hidden state of the real
tokens) and records, per sample, the transformer's ``encoder_hidden_states`` — that one
caption, ``[L, D]`` (a tensor or a one-element list) — under ``pos_cond_kwargs``, the negative
prompt's under ``neg_cond_kwargs`` with CFG, beside RoPE tables (``freqs_cis``) that training
does not need. Captions of different lengths need no padding here: ``ZImageConditions`` packs
them. SGLang combines CFG as ``uncond + s·(cond − uncond)`` (its denoising stage's
``_combine_cfg_serial``; ``ZImagePipelineConfig`` keeps the default scale hook), UniRL's
``guidance_scale`` convention, so the default ``guidance_scale`` key is right. Its latents run as
``[C, 1, h, w]`` (one frame); ours are ``[C, h, w]``.

**vLLM-Omni** is not mapped. Its Z-Image pipeline (``vllm_omni/diffusion/models/z_image``,
read at vllm-project/vllm-omni 01dc18c) encodes the prompt text itself (precomputed
embeddings are not read from the request), lets the scheduler space σ itself with
``sigma_min = 0`` instead of the ``linspace(1, 1/T, T)`` the diffusers pipeline passes (the
adapter's σ check would refuse every rollout), and gates CFG at ``guidance_scale > 1`` while
combining with diffusers' ``pos + g·(pos − neg)``. The adapter refuses the family in one line.

Written against the engines' published code; no run of SGLang on Z-Image was possible here
(tested against a fake denoising env, ``tests/models/test_z_image_bundle.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from unirl.models.common.engine_maps import (
    Engine,
    EngineMapError,
    EngineMaps,
    cond_kwargs,
    sample_tensor,
)
from unirl.models.z_image.conditions import ZImageConditions
from unirl.types import Packed

CAPTION_KEY = "encoder_hidden_states"


class ZImageEngineMaps(EngineMaps):
    """SGLang conditions and the one-frame latent layout of Z-Image."""

    family: ClassVar[str] = "unirl.models.z_image.ZImageBundle"
    engines: ClassVar[tuple[Engine, ...]] = ("sglang",)

    def sglang_conditions(self, envs: Sequence[Mapping[str, Any]]) -> ZImageConditions:
        """``ZImageConditions`` with one caption per sample (packed, no padding); negatives
        only when every sample has them."""
        with_negative = bool(envs) and all(
            CAPTION_KEY in cond_kwargs(env, "neg_cond_kwargs") for env in envs
        )
        captions, negatives = [], []
        for env in envs:
            pos = cond_kwargs(env, "pos_cond_kwargs")
            if CAPTION_KEY not in pos:
                raise EngineMapError(
                    f"denoising_env.pos_cond_kwargs has no {CAPTION_KEY!r} (keys: {sorted(pos)}); "
                    "training replay needs the encoded conditions (rollout_return_denoising_env=true)"
                )
            captions.append(sample_tensor(pos[CAPTION_KEY], 2, f"pos {CAPTION_KEY}"))
            if with_negative:
                neg = cond_kwargs(env, "neg_cond_kwargs")
                negatives.append(sample_tensor(neg[CAPTION_KEY], 2, f"neg {CAPTION_KEY}"))
        return ZImageConditions(
            prompt_embeds=Packed.from_list(captions),
            negative_prompt_embeds=Packed.from_list(negatives) if with_negative else None,
        )

    def from_engine_latents(
        self, latents: torch.Tensor, latent_shape: tuple[int, ...]
    ) -> torch.Tensor:
        """``[..., C, 1, h, w]`` (one frame) -> ``[..., C, h, w]``; ours passes unchanged."""
        channels, height, width = latent_shape
        if tuple(latents.shape[-4:]) == (channels, 1, height, width):
            return latents.squeeze(-3)
        return latents
