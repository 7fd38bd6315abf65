"""Qwen-Image proves the shared family contract (``family_tester.py``) on its ``tiny`` preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline
from family_tester import DiffusersSample, FamilyTester, run_diffusers

from unirl.models.qwen_image import (
    QwenImageBundle,
    QwenImagePipeline,
    count_params,
    qwen_image_arch_spec,
)

TEXT_TOKENS = 64


class TestQwenImageFamily(FamilyTester):
    pipeline_class = QwenImagePipeline
    bundle_class = QwenImageBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": TEXT_TOKENS}
    diffusers_class = DiffusersQwenImagePipeline
    guidance_scale = 4.0

    def tiny_path(self) -> Path:
        from unirl.models.qwen_image import tiny_preset_path

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
        n = x_T.shape[0]
        latents, pixels = run_diffusers(
            pipe,
            prompts=prompts,
            negative_prompt=negative_prompt,
            true_cfg_scale=guidance_scale,
            num_inference_steps=steps,
            height=height,
            width=width,
            latents=x_T.reshape(n, -1, x_T.shape[-1]),  # diffusers' packed [N, L, 4C]
            max_sequence_length=TEXT_TOKENS,
        )
        return DiffusersSample(
            latents=latents.reshape(x_T.shape), pixels=pixels, sigmas=pipe.scheduler.sigmas
        )

    def check_arch(self) -> None:
        spec = qwen_image_arch_spec()
        tr, te = spec.transformer, spec.text_encoder["text_config"]
        assert (
            tr["num_layers"] == 60 and tr["num_attention_heads"] * tr["attention_head_dim"] == 3072
        )
        assert tr["joint_attention_dim"] == te["hidden_size"] == 3584
        assert tr["in_channels"] == 4 * spec.vae["z_dim"] == 64
        assert sum(tr["axes_dims_rope"]) == tr["attention_head_dim"]
        counts = count_params(spec)
        assert 20.0e9 <= counts["transformer"] <= 21.0e9, counts  # Qwen-Image: 20.4 B
        assert 8.0e9 <= counts["text_encoder"] <= 8.5e9, counts  # Qwen2.5-VL-7B: 8.3 B
        module = QwenImageBundle.trainable_on_meta({"path": "qwen-image-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        assert sum(p.numel() for p in module.parameters()) == counts["transformer"]
