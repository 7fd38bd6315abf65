"""FLUX.2-Klein proves the shared family contract (``family_tester.py``) on its ``tiny`` preset:
the step-distilled variant (no CFG, like FLUX.2-klein-4B) and the base variant (true CFG in
two forwards, like FLUX.2-klein-base-4B). Both also sample with a reference image (editing)
exactly as diffusers' ``Flux2KleinPipeline(image=...)`` does."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from diffusers import Flux2KleinPipeline as DiffusersFlux2KleinPipeline
from family_tester import DiffusersSample, FamilyTester
from PIL import Image

from unirl.models.flux2 import (
    Flux2KleinBundle,
    Flux2KleinPipeline,
    TinyFlux2Spec,
    count_params,
    flux2_klein_arch_spec,
    tiny_preset_path,
)
from unirl.sde import ODE
from unirl.types import DiffusionRequest, Images

TEXT_TOKENS = 32


def reference_image(width: int = 96, height: int = 64) -> Image.Image:
    """A deterministic RGB picture (gradients and a square), another size than the samples,
    so the reference's own token grid and positions are exercised."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, ((x // 16 + y // 16) % 2) * 200], -1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def as_pixels(image: Image.Image, rows: int) -> torch.Tensor:
    """``[rows, 3, H, W]`` float32 in [0, 1], as diffusers reads a PIL image (x / 255)."""
    array = np.asarray(image).astype(np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)[None].repeat(rows, 1, 1, 1)


def run_klein(pipe: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``Flux2KleinPipeline`` call: ``(packed final latents [N, h·w, C], pixels)``.
    (The shared ``run_diffusers`` passes ``negative_prompt``, which this pipeline does not
    take: its negative prompt is always "".)"""
    captured: dict[str, torch.Tensor] = {}

    def grab(_pipe: Any, _i: int, _t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        captured["latents"] = tensors["latents"]
        return {}

    out = pipe(
        output_type="pt",
        callback_on_step_end=grab,
        callback_on_step_end_tensor_inputs=["latents"],
        **kwargs,
    )
    return captured["latents"], out.images


class TestFlux2KleinFamily(FamilyTester):
    pipeline_class = Flux2KleinPipeline
    bundle_class = Flux2KleinBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": TEXT_TOKENS}
    diffusers_class = DiffusersFlux2KleinPipeline
    lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "to_qkv_mlp_proj")
    guidance_scale = 1.0  # step-distilled: no CFG
    spec = TinyFlux2Spec()

    def tiny_path(self) -> Path:
        return tiny_preset_path(self.spec)

    def make_bundle(self, **overrides: Any) -> Flux2KleinBundle:
        # the spec's folder (the base variant's is not the `tiny` preset)
        return super().make_bundle(**{"path": str(self.tiny_path()), **overrides})

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
        image: Image.Image | None = None,
    ) -> DiffusersSample:
        assert negative_prompt == ""  # the FLUX.2 pipelines always use ""
        latents, pixels = run_klein(
            pipe,
            image=image,
            prompt=prompts,
            guidance_scale=guidance_scale,
            num_inference_steps=steps,
            height=height,
            width=width,
            latents=x_T.permute(0, 3, 1, 2),  # ours [N, h, w, C] -> diffusers' [N, C, h, w]
            max_sequence_length=TEXT_TOKENS,
        )
        return DiffusersSample(
            latents=latents.reshape(x_T.shape), pixels=pixels, sigmas=pipe.scheduler.sigmas
        )

    def check_arch(self) -> None:
        spec = flux2_klein_arch_spec()
        tr, te = spec.transformer, spec.text_encoder
        assert (tr["num_layers"], tr["num_single_layers"]) == (5, 20)
        assert tr["num_attention_heads"] * tr["attention_head_dim"] == 3072
        assert tr["joint_attention_dim"] == 3 * te["hidden_size"] == 7680
        assert tr["in_channels"] == 4 * spec.vae["latent_channels"] == 128
        assert sum(tr["axes_dims_rope"]) == tr["attention_head_dim"]
        assert spec.is_distilled and not tr["guidance_embeds"]
        counts = count_params(spec)
        assert 3.85e9 <= counts["transformer"] <= 3.9e9, counts  # FLUX.2-klein-4B: 3.88 B
        assert 4.0e9 <= counts["text_encoder"] <= 4.05e9, counts  # Qwen3-4B: 4.02 B
        module = Flux2KleinBundle.trainable_on_meta({"path": "flux2-klein-arch"})
        assert module is not None and next(module.parameters()).device.type == "meta"
        assert sum(p.numel() for p in module.parameters()) == counts["transformer"]

    # -- editing: one reference image per row ---------------------------------------------------

    def test_reference_image_sampling_equals_diffusers(self, diffusers_pipe: Any) -> None:
        bundle = self.make_bundle()
        pipeline = self.pipeline_class(bundle=bundle, strategy=ODE())
        req = self.request(
            bundle, samples_per_prompt=1, sde_steps=(), guidance_scale=self.guidance_scale
        )
        image = reference_image()
        req = dataclasses.replace(
            req, primitives={**req.primitives, "image": Images(pixels=as_pixels(image, len(req)))}
        )
        track = pipeline.generate(req).tracks["diffusion"]
        assert track.conditions.reference_latents.shape == (len(req), 4 * 6, 64)
        ref = self.diffusers_sample(
            diffusers_pipe,
            prompts=list(req.prompts),
            x_T=req.params_for("diffusion", DiffusionRequest).initial_noise(req.seed),
            steps=self.steps,
            guidance_scale=self.guidance_scale,
            negative_prompt="",
            height=self.height,
            width=self.width,
            image=image,
        )
        self.assert_within(track.segment.final_latents, ref.latents, self.latent_atol, "latents")
        self.assert_within(track.decoded.pixels, ref.pixels, self.pixel_atol, "pixels")
        # the reference conditions the sample: without it the result differs
        plain = pipeline.generate(
            dataclasses.replace(req, primitives={"text": req.primitives["text"]})
        )
        moved = (plain.tracks["diffusion"].segment.final_latents - ref.latents).abs().max()
        assert float(moved) > 1e-3


class TestFlux2KleinBaseFamily(TestFlux2KleinFamily):
    """The undistilled variant: true CFG, a conditional and a negative ("") forward per step."""

    guidance_scale = 4.0
    spec = TinyFlux2Spec(is_distilled=False)
    test_arch_preset_has_the_released_shapes = None  # one arch preset: checked above

    @pytest.mark.slow
    @pytest.mark.skipif(
        os.environ.get("UNIRL_SLOW") != "1",
        reason="slow (UNIRL_SLOW=1): the adapter export path is the distilled variant's, tested above",
    )
    def test_exported_lora_loads_into_diffusers(self, trained: Any, tmp_path: Path) -> None:
        super().test_exported_lora_loads_into_diffusers(trained, tmp_path)
