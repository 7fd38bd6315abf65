"""Z-Image proves the shared family contract (``family_tester.py``) on its ``tiny`` preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from diffusers import ZImagePipeline as DiffusersZImagePipeline
from family_tester import DiffusersSample, FamilyTester, run_diffusers

from unirl.models.z_image import (
    ZImageBundle,
    ZImagePipeline,
    count_params,
    z_image_arch_spec,
)

TEXT_TOKENS = 64


def diffusers_guidance(scale: float) -> float:
    """Our CFG scale s as diffusers' ``ZImagePipeline.guidance_scale`` (s − 1; 0 = off)."""
    return scale - 1.0 if scale > 1.0 else 0.0


class TestZImageFamily(FamilyTester):
    pipeline_class = ZImagePipeline
    bundle_class = ZImageBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": TEXT_TOKENS}
    diffusers_class = DiffusersZImagePipeline
    guidance_scale = 4.0  # diffusers' guidance_scale=3
    latent_atol = 0.0
    pixel_atol = 0.0

    def tiny_path(self) -> Path:
        from unirl.models.z_image import tiny_preset_path

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
        latents, pixels = run_diffusers(
            pipe,
            prompts=prompts,
            negative_prompt=negative_prompt,
            guidance_scale=diffusers_guidance(guidance_scale),
            num_inference_steps=steps,
            height=height,
            width=width,
            latents=x_T,  # the VAE latent [N, 16, H/8, W/8], as ours
            max_sequence_length=TEXT_TOKENS,
        )
        return DiffusersSample(latents=latents, pixels=pixels, sigmas=pipe.scheduler.sigmas)

    def check_arch(self) -> None:
        spec = z_image_arch_spec()
        tr, te = spec.transformer, spec.text_encoder
        assert tr["n_layers"] == 30 and tr["n_refiner_layers"] == 2
        assert tr["dim"] == 3840 and tr["dim"] // tr["n_heads"] == sum(tr["axes_dims"]) == 128
        assert tr["cap_feat_dim"] == te["hidden_size"] == 2560
        assert tr["in_channels"] == spec.vae["latent_channels"] == 16
        counts = count_params(spec)
        assert 6.10e9 <= counts["transformer"] <= 6.20e9, counts  # Z-Image: 6.15 B
        assert 4.00e9 <= counts["text_encoder"] <= 4.05e9, counts  # Qwen3-4B: 4.02 B
        module = ZImageBundle.trainable_on_meta({"path": "z-image-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        assert sum(p.numel() for p in module.parameters()) == counts["transformer"]
