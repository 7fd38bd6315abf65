"""The unified (transfusion) family proves the shared family contract (``family_tester.py``)
for its image stage and the shared text-family contract (``text_family_tester.py``) for its
text stage, on its ``tiny`` preset.

Where the tester compares with a diffusers pipeline, this family has none (no transfusion
model ships in diffusers); the references here are written in the test from the model's own
forward: a plain Euler loop for ODE sampling, and peft's ``PeftModel.from_pretrained`` for
the exported LoRA."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from family_tester import FamilyTester
from text_family_tester import TextFamilyTester

from unirl.models.unified import (
    ContextConditions,
    TransfusionBundle,
    TransfusionImagePipeline,
    TransfusionTextPipeline,
    image_attention_mask,
)
from unirl.sde import ODE
from unirl.types import DiffusionRequest


def euler_reference(bundle: Any, prompts: list[str], x_T: torch.Tensor, sigmas: torch.Tensor):
    """ODE sampling written out: ``x ← x + v(x, σ_j)·(σ_{j+1} − σ_j)`` through the model's
    forward, then the VAE. Returns ``(final latents, pixels)``."""
    ids, mask = ContextConditions.from_rows(bundle.encode_prompts(prompts)).padded(bundle.device)
    x = x_T.clone()
    with torch.no_grad():
        for j in range(len(sigmas) - 1):
            sigma = sigmas[j].expand(x.shape[0])
            v = bundle.model(image_latents=x, sigma=sigma, context_ids=ids, context_mask=mask)
            x = x + v.float() * (sigmas[j + 1] - sigmas[j])
        z = x / bundle.scaling_factor + bundle.shift_factor
        pixels = (bundle.vae.decode(z, return_dict=False)[0].float() / 2 + 0.5).clamp(0, 1)
    return x, pixels


class TestUnifiedFamily(FamilyTester):
    # the tester reads the ``diffusion`` track; the family's default name is ``image``
    pipeline_class = functools.partial(TransfusionImagePipeline, track_name="diffusion")
    bundle_class = TransfusionBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_grid": 8}
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    guidance_scale = 1.0  # no unconditional branch (NoGuidance)
    latent_atol = 0.0
    pixel_atol = 0.0

    def make_bundle(self, **overrides: Any) -> Any:
        fields = {"path": "tiny", "dtype": "fp32", "device": "cpu", **self.bundle_fields}
        return TransfusionBundle(**{**fields, **overrides})

    @pytest.fixture(scope="class")
    def diffusers_pipe(self) -> Any:
        return None  # no diffusers pipeline for this family (see the module docstring)

    def test_ode_sampling_equals_diffusers(self, diffusers_pipe: Any) -> None:
        """Our pipeline's ODE sampling equals the written-out Euler loop, bit for bit."""
        bundle = self.make_bundle()
        pipeline = self.pipeline_class(bundle=bundle, strategy=ODE())
        req = self.request(bundle, samples_per_prompt=1, sde_steps=(), guidance_scale=1.0)
        track = pipeline.generate(req).tracks["diffusion"]
        stage = req.params_for("diffusion", DiffusionRequest)
        latents, pixels = euler_reference(
            bundle, list(req.prompts), stage.initial_noise(req.seed), stage.sigmas
        )
        self.assert_within(track.segment.final_latents, latents, 0.0, "latents")
        self.assert_within(track.decoded.pixels, pixels, 0.0, "pixels")

    def test_exported_lora_loads_into_diffusers(self, trained: Any, tmp_path: Path) -> None:
        """The exported adapter loads with ``peft.PeftModel.from_pretrained`` into a fresh
        model and reproduces our adapter's ODE samples exactly."""
        from peft import PeftModel

        trained.backend.export_lora(tmp_path / "lora")
        req = self.request(trained.bundle, samples_per_prompt=1, sde_steps=(), guidance_scale=1.0)
        ours = self.pipeline_class(bundle=trained.bundle, strategy=ODE()).generate(req)
        fresh = self.make_bundle()
        stage = req.params_for("diffusion", DiffusionRequest)
        x_T = stage.initial_noise(req.seed)
        base, _ = euler_reference(fresh, list(req.prompts), x_T, stage.sigmas)
        fresh.model = PeftModel.from_pretrained(fresh.model, str(tmp_path / "lora"))
        loaded, _ = euler_reference(fresh, list(req.prompts), x_T, stage.sigmas)
        moved = float((loaded - base).abs().max())
        assert moved > 1e-4, f"the exported adapter moved the latents by only {moved:.3g}"
        self.assert_within(
            ours.tracks["diffusion"].segment.final_latents, loaded, 1e-6, "latents with LoRA"
        )

    def test_arch_preset_has_the_released_shapes(self) -> None:
        pytest.skip("the transfusion family has only the tiny preset (no *-arch preset)")


def test_image_tokens_see_the_text_and_each_other_text_stays_causal() -> None:
    mask = image_attention_mask(torch.tensor([[0, 1, 1]]), 2)[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],  # padding: itself only
            [0, 1, 0, 0, 0],  # text: causal over real text
            [0, 1, 1, 0, 0],
            [0, 1, 1, 1, 1],  # image: all real text and every image token
            [0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_the_image_depends_on_the_written_text() -> None:
    """Same prompt and x_T, different text after the prompt: different velocity (the image
    stage is conditioned on what the model wrote)."""
    bundle = TransfusionBundle(path="tiny", dtype="fp32", device="cpu", max_grid=8)
    prompt = bundle.encode_prompts(["a red fox"])[0]
    a = ContextConditions.from_rows([[*prompt, 40, 41, 42]])
    b = ContextConditions.from_rows([[*prompt, 50, 51, 52]])
    x = torch.randn(1, *bundle.latent_shape(32, 32), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.7])
    with torch.no_grad():
        va, vb = bundle.predict_velocity(x, sigma, a), bundle.predict_velocity(x, sigma, b)
    assert float((va - vb).abs().max()) > 1e-4


def test_only_the_tiny_preset_is_accepted() -> None:
    from unirl.config.require import ConfigError

    with pytest.raises(ConfigError, match="only the 'tiny' preset"):
        TransfusionBundle.check_config({"path": "tencent/HunyuanImage-3.0"}, None)


class TestUnifiedTextFamily(TextFamilyTester):
    """The text stage: the reference ``generate`` is the wrapped causal LM's (``model.lm``)."""

    pipeline_class = TransfusionTextPipeline
    bundle_class = TransfusionBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_grid": 8}

    def hf_model(self, bundle: Any) -> Any:
        return bundle.model.lm
