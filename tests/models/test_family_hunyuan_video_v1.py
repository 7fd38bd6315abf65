"""HunyuanVideo 1.0 proves the shared family contract (``family_tester.py``) on its tiny
preset: videos of 5 frames (2 latent frames) at 32x48 (a 4x6 latent grid, 2x3 tokens per
frame), 32 Llama tokens after the template's crop, the embedded guidance scale 4.0 (diffusers'
``guidance_scale``; no true CFG on either side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from diffusers import HunyuanVideoPipeline as DiffusersHunyuanVideoPipeline
from family_tester import DiffusersSample, FamilyTester, run_diffusers

from unirl.models.hunyuan_video_v1 import (
    HunyuanVideoBundle,
    HunyuanVideoPipeline,
    count_params,
    hunyuan_video_arch_spec,
    tiny_preset_path,
)

TEXT_TOKENS = 32


class TestHunyuanVideoFamily(FamilyTester):
    pipeline_class = HunyuanVideoPipeline
    diffusers_class = DiffusersHunyuanVideoPipeline
    bundle_class = HunyuanVideoBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": TEXT_TOKENS}
    lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj")
    guidance_scale = 4.0
    height = 32
    width = 48
    num_frames = 5

    def tiny_path(self) -> Path:
        return tiny_preset_path()

    def diffusers_sample(
        self,
        pipe: Any,
        *,
        prompts: list[str],
        x_T: torch.Tensor,
        steps: int,
        guidance_scale: float,
        negative_prompt: str,
        height: int,
        width: int,
    ) -> DiffusersSample:
        # the negative prompt is ignored by the pipeline without true_cfg_scale > 1, as by us
        latents, frames = run_diffusers(
            pipe,
            prompts=prompts,
            negative_prompt=negative_prompt,
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            height=height,
            width=width,
            num_frames=self.num_frames,
            latents=x_T,  # the same [N, C, F, h, w] layout as ours
            max_sequence_length=TEXT_TOKENS,
        )
        return DiffusersSample(latents=latents, pixels=frames, sigmas=pipe.scheduler.sigmas)

    def check_arch(self) -> None:
        spec = hunyuan_video_arch_spec()
        tr = spec.transformer
        assert tr["num_layers"] == 20 and tr["num_single_layers"] == 40
        assert tr["num_attention_heads"] * tr["attention_head_dim"] == 3072
        assert tr["in_channels"] == spec.vae["latent_channels"] == 16
        assert tr["text_embed_dim"] == spec.text_encoder["hidden_size"] == 4096
        assert tr["pooled_projection_dim"] == spec.text_encoder_2["hidden_size"] == 768
        assert tr["guidance_embeds"] is True and spec.scheduler["shift"] == 7.0
        counts = count_params(spec)
        assert 12.7e9 <= counts["transformer"] <= 12.9e9, counts  # "13 B parameters"
        assert 7.4e9 <= counts["text_encoder"] <= 7.6e9, counts  # Llama-3-8B without its head
        assert 0.12e9 <= counts["text_encoder_2"] <= 0.13e9, counts  # CLIP ViT-L/14's text model
        module = HunyuanVideoBundle.trainable_on_meta({"path": "hunyuan-video-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        assert sum(p.numel() for p in module.parameters()) == counts["transformer"]
