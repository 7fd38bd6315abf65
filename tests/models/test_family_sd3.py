"""SD3 proves the shared family contract (``family_tester.py``) on its ``tiny`` preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from diffusers import StableDiffusion3Pipeline
from family_tester import DiffusersSample, FamilyTester, run_diffusers

from unirl.models.sd3 import SD3Bundle, SD3Pipeline, count_transformer_params, sd35_medium_arch_spec

T5_TOKENS = 32


class TestSD3Family(FamilyTester):
    pipeline_class = SD3Pipeline
    bundle_class = SD3Bundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": T5_TOKENS}
    diffusers_class = StableDiffusion3Pipeline
    guidance_scale = 4.5

    def tiny_path(self) -> Path:
        from unirl.models.sd3 import tiny_preset_path

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
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            height=height,
            width=width,
            latents=x_T,
            max_sequence_length=T5_TOKENS,
        )
        return DiffusersSample(latents=latents, pixels=pixels, sigmas=pipe.scheduler.sigmas)

    def check_arch(self) -> None:
        spec = sd35_medium_arch_spec()
        tr = spec.transformer
        assert (
            tr["num_layers"] == 24 and tr["num_attention_heads"] * tr["attention_head_dim"] == 1536
        )
        assert tr["joint_attention_dim"] == spec.t5["d_model"] == 4096
        assert 2.2e9 <= count_transformer_params(spec) <= 2.5e9
        module = SD3Bundle.trainable_on_meta({"path": "sd3.5-medium-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        names = {n.rsplit(".", 1)[-1] for n, _ in module.named_modules()}
        assert {"to_q", "add_q_proj", "to_add_out"} <= names
