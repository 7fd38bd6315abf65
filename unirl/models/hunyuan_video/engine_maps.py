"""HunyuanVideo 1.5's dialect on vLLM-Omni (``HunyuanVideo15Bundle.engine_maps``).

The data is what diffusers' ``HunyuanVideo15Pipeline`` takes precomputed: the Qwen2.5-VL rows
``prompt_embeds [L, D]`` with ``prompt_embeds_mask [L]`` and the ByT5 glyph rows
``prompt_embeds_2 [G, D2]`` with ``prompt_embeds_mask_2 [G]``, and the negative prompt's four
of the same shapes. As for the image families, ``prompt_embeds`` / ``negative_prompt_embeds``
go in the prompt itself and the rest under ``additional_information`` with the pipeline's
argument names. Latents are ``[C, F, h, w]`` on every side (the pipeline's
``latents[N, 32, F, H/16, W/16]``, scaled the same way), so pinning x_T and reading the
trajectory back is the identity.

Assumptions (vLLM-Omni's HunyuanVideo 1.5 request format could not be checked here): the
frame count and rate go in the sampling params as ``num_frames`` / ``fps`` (``frames_key`` /
``fps_key``; ``fps_key = None`` drops the rate), the CFG knob is ``guidance_scale``
(``guidance_key``), and the pipeline's own guider uses it as ``v_u + s (v_c - v_u)`` as our
replay does. A deployment with other names subclasses these maps and changes the class
attributes.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from unirl.models.common.engine_maps import Engine, EngineMapError, PromptEntry, VideoEngineMaps
from unirl.models.hunyuan_video.conditions import HunyuanVideo15Conditions
from unirl.types import Conditions


class HunyuanVideo15EngineMaps(VideoEngineMaps):
    """vLLM-Omni prompt kwargs, CFG and frame keys, and the latent layout of HunyuanVideo 1.5."""

    family: ClassVar[str] = "unirl.models.hunyuan_video.HunyuanVideo15Bundle"
    engines: ClassVar[tuple[Engine, ...]] = ("vllm_omni",)

    def vllm_omni_prompt(self, conditions: Conditions, row: int) -> dict[str, PromptEntry]:
        """``prompt_embeds`` / ``negative_prompt_embeds`` ``[1, L, D]`` of row ``row`` and, under
        ``additional_information``, the ``[1, L]`` masks and the glyph rows ``[1, G, D2]`` with
        their ``[1, G]`` masks (None on the negative side without CFG)."""
        if not isinstance(conditions, HunyuanVideo15Conditions):
            raise EngineMapError(
                f"expected HunyuanVideo15Conditions, got {type(conditions).__name__}"
            )
        one = slice(row, row + 1)

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[one]

        c = conditions
        return {
            "prompt_embeds": c.prompt_embeds[one],
            "negative_prompt_embeds": rows(c.negative_prompt_embeds),
            "additional_information": {
                "prompt_embeds_mask": c.prompt_mask[one],
                "negative_prompt_embeds_mask": rows(c.negative_prompt_mask),
                "prompt_embeds_2": c.glyph_embeds[one],
                "prompt_embeds_mask_2": c.glyph_mask[one],
                "negative_prompt_embeds_2": rows(c.negative_glyph_embeds),
                "negative_prompt_embeds_mask_2": rows(c.negative_glyph_mask),
            },
        }
