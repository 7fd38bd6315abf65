"""SD3 proves the shared family contract (``family_tester.py``) on its ``tiny`` preset."""

from __future__ import annotations

from typing import Any

import torch
from family_tester import DiffusersSample, FamilyTester

from unirl.models.sd3 import SD3Bundle, SD3Pipeline, count_transformer_params, sd35_medium_arch_spec

T5_TOKENS = 32


class TestSD3Family(FamilyTester):
    pipeline_class = SD3Pipeline
    guidance_scale = 4.5

    def make_bundle(self, **overrides: Any) -> SD3Bundle:
        kwargs: dict[str, Any] = {
            "path": "tiny",
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
            "max_sequence_length": T5_TOKENS,
        }
        return SD3Bundle(**{**kwargs, **overrides})

    def load_diffusers(self) -> Any:
        from diffusers import StableDiffusion3Pipeline

        from unirl.models.common.progress import hf_progress_bars_disabled
        from unirl.models.sd3 import tiny_preset_path

        with hf_progress_bars_disabled():
            pipe = StableDiffusion3Pipeline.from_pretrained(
                tiny_preset_path(), local_files_only=True
            )
        pipe.set_progress_bar_config(disable=True)
        return pipe

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
        captured: dict[str, torch.Tensor] = {}

        def grab(_pipe: Any, _i: int, _t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            captured["latents"] = tensors["latents"]
            return {}

        out = pipe(
            prompt=prompts,
            negative_prompt=[negative_prompt] * len(prompts),
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            height=height,
            width=width,
            latents=x_T,
            max_sequence_length=T5_TOKENS,
            output_type="pt",
            callback_on_step_end=grab,
            callback_on_step_end_tensor_inputs=["latents"],
        )
        return DiffusersSample(
            latents=captured["latents"], pixels=out.images, sigmas=pipe.scheduler.sigmas
        )

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
