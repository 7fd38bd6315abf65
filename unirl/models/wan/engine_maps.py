"""Wan's dialect on vLLM-Omni (``WanBundle.engine_maps``), text-to-video only.

The data is what diffusers' ``WanPipeline`` takes precomputed: ``prompt_embeds [L, D]`` (UMT5
rows, zero past the prompt's tokens, ``L`` the max sequence length) and the negative
prompt's of the same shape, in the prompt itself; there are no masks. Latents are
``[C, F, h, w]`` on every side (the pipeline's ``latents[N, 16, F, H/8, W/8]``, normalised
with the VAE's per-channel mean / std the same way), so the layout map is the identity.

Assumptions (vLLM-Omni's Wan request format could not be checked here): ``num_frames`` /
``fps`` in the sampling params (``frames_key`` / ``fps_key``; ``fps_key = None`` drops the
rate) and CFG through ``guidance_scale`` only: with two experts (Wan 2.2) the low-noise
expert's scale is left unset, which the diffusers pipeline reads as the same scale, as our
replay uses. Image-to-video rows (``image_condition``) are refused: their first-frame latents
have no mapped argument.
"""

from __future__ import annotations

from typing import ClassVar

from unirl.models.common.engine_maps import Engine, EngineMapError, PromptEntry, VideoEngineMaps
from unirl.models.wan.conditions import WanConditions
from unirl.types import Conditions


class WanEngineMaps(VideoEngineMaps):
    """vLLM-Omni prompt kwargs, CFG and frame keys, and the latent layout of Wan T2V."""

    family: ClassVar[str] = "unirl.models.wan.WanBundle"
    engines: ClassVar[tuple[Engine, ...]] = ("vllm_omni",)

    def vllm_omni_prompt(self, conditions: Conditions, row: int) -> dict[str, PromptEntry]:
        """``prompt_embeds`` / ``negative_prompt_embeds`` ``[1, L, D]`` of row ``row``."""
        if not isinstance(conditions, WanConditions):
            raise EngineMapError(f"expected WanConditions, got {type(conditions).__name__}")
        if conditions.image_condition is not None or conditions.image_embeds is not None:
            raise EngineMapError(
                f"{self.family}: image-to-video conditions are not mapped for vLLM-Omni; "
                "sample Wan I2V with the trainside engine"
            )
        one = slice(row, row + 1)
        neg = conditions.negative_prompt_embeds
        return {
            "prompt_embeds": conditions.prompt_embeds[one],
            "negative_prompt_embeds": None if neg is None else neg[one],
        }
