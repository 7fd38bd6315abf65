"""Wan proves the shared family contract (``family_tester.py``) on its tiny presets: Wan 2.1
text-to-video (``tiny``), and Wan 2.2 with both experts training (``tiny-wan2.2``: the
high-noise ``transformer`` owns σ ≥ 0.875, the low-noise ``transformer_2`` the rest, so the
4-step schedule 1, 0.858, 0.602, 0.009 crosses the boundary after its first step and the
trained steps 0, 1, 2 exercise both). Videos of 5 frames (2 latent frames) at 32x48."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import WanPipeline as DiffusersWanPipeline
from family_tester import DiffusersSample, FamilyTester, run_diffusers

from unirl.models.wan import (
    WanBundle,
    WanPipeline,
    count_params,
    tiny_preset_path,
    wan21_1_3b_arch_spec,
    wan22_14b_arch_spec,
)

TEXT_TOKENS = 32


class WanFamilyTester(FamilyTester):
    pipeline_class = WanPipeline
    diffusers_class = DiffusersWanPipeline
    guidance_scale = 4.0
    height = 32
    width = 48
    num_frames = 5
    preset = "tiny"

    def make_bundle(self, **overrides: Any) -> WanBundle:
        kwargs: dict[str, Any] = {
            "path": self.preset,
            "dtype": "fp32",
            "text_encoder_dtype": "fp32",
            "device": "cpu",
            "max_sequence_length": TEXT_TOKENS,
        }
        return WanBundle(**{**kwargs, **overrides})

    def tiny_path(self) -> Path:
        return tiny_preset_path(self.preset)

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
        latents, frames = run_diffusers(
            pipe,
            prompts=prompts,
            negative_prompt=negative_prompt,
            guidance_scale=guidance_scale,
            num_inference_steps=steps,
            height=height,
            width=width,
            num_frames=self.num_frames,
            latents=x_T,  # the same [N, C, F, h, w] layout as ours
            max_sequence_length=TEXT_TOKENS,
        )
        return DiffusersSample(latents=latents, pixels=frames, sigmas=pipe.scheduler.sigmas)


class TestWan21Family(WanFamilyTester):
    def check_arch(self) -> None:
        spec = wan21_1_3b_arch_spec()
        tr = spec.transformer
        assert (
            tr["num_layers"] == 30 and tr["num_attention_heads"] * tr["attention_head_dim"] == 1536
        )
        assert tr["ffn_dim"] == 8960 and tr["text_dim"] == spec.text_encoder["d_model"] == 4096
        assert tr["in_channels"] == spec.vae["z_dim"] == 16 and spec.transformer_2 is None
        counts = count_params(spec)
        assert 1.40e9 <= counts["transformer"] <= 1.43e9, counts  # Wan2.1-T2V-1.3B: 1.42 B
        assert 5.6e9 <= counts["text_encoder"] <= 5.8e9, counts  # UMT5-XXL encoder: 5.68 B
        module = WanBundle.trainable_on_meta({"path": "wan2.1-1.3b-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        assert sum(p.numel() for p in module.parameters()) == counts["transformer"]


class TestWan22Family(WanFamilyTester):
    preset = "tiny-wan2.2"

    def load_exported_lora(self, pipe: Any, folder: Path) -> None:
        # backend.export_lora wrote one diffusers folder per trained expert
        # (WanBundle.postprocess_lora_export), beside the combined file
        pipe.load_lora_weights(str(folder / "transformer"))
        pipe.load_lora_weights(str(folder / "transformer_2"), load_into_transformer_2=True)

    def test_the_update_reaches_both_experts(self, trained: Any) -> None:
        """One optimizer step over trained steps on both sides of the boundary moves the LoRA
        of both experts (LoRA B starts at zero: nonzero means a gradient reached it)."""
        moved = {"transformer": 0.0, "transformer_2": 0.0}
        for name, param in trained.backend.named_trainable_parameters():
            expert = name.split(".", 1)[0]
            if "lora_B" in name:
                moved[expert] = max(moved[expert], float(param.detach().abs().max()))
        assert moved["transformer"] > 0 and moved["transformer_2"] > 0, moved

    def check_arch(self) -> None:
        spec = wan22_14b_arch_spec()
        assert spec.boundary_ratio == 0.875 and spec.transformer_2 == spec.transformer
        tr = spec.transformer
        assert (
            tr["num_layers"] == 40 and tr["num_attention_heads"] * tr["attention_head_dim"] == 5120
        )
        counts = count_params(spec)
        assert 14.2e9 <= counts["transformer"] == counts["transformer_2"] <= 14.4e9, counts
