"""Flux2KleinBundle against diffusers' own Flux2KleinPipeline pieces on the tiny preset: prompt
encoding, the σ policy (μ from image tokens *and* steps), reference-image latents and positions,
the velocity call, packing and decode; guidance per variant; the tiny decoder responds to
latents; SGLang maps; config, checks and plumbing. (The shared contract — ODE sampling with and
without a reference, ratio 1, replay, LoRA export, arch — is ``test_family_flux2.py``.)"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from bundle_contract import BundleContract

from unirl.config import ConfigError
from unirl.models.common.engine_maps import engine_maps_for
from unirl.models.common.guidance import NoGuidance, SeparateCFG
from unirl.models.flux2 import (
    Flux2KleinBundle,
    Flux2KleinBundleConfig,
    Flux2KleinConditions,
    Flux2KleinEngineMaps,
    Flux2KleinPipeline,
    TinyFlux2Spec,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.flux2.tiny import SCHEDULER_CONFIG
from unirl.sde import FlowSDE
from unirl.sde.schedule import flux2_empirical_mu, sigmas_from_scheduler_config
from unirl.types import DiffusionRequest, DiffusionSamplingParams, Images, RolloutReq, Texts

PROMPTS = ["a red fox, oil painting", 'a neon sign that says "OPEN"', ""]
TOKENS = 32
POLICY = {**SCHEDULER_CONFIG, "sigma_spacing": "linspace", "mu_policy": "flux2_empirical"}


def make(**overrides: Any) -> Flux2KleinBundle:
    kwargs: dict[str, Any] = {
        "path": "tiny",
        "dtype": "fp32",
        "text_encoder_dtype": "fp32",
        "device": "cpu",
        "max_sequence_length": TOKENS,
    }
    return Flux2KleinBundle(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def bundle() -> Flux2KleinBundle:
    return make()


@pytest.fixture(scope="module")
def reference():
    from diffusers import Flux2KleinPipeline as DiffusersFlux2KleinPipeline

    from unirl.models.common.progress import hf_progress_bars_disabled

    with hf_progress_bars_disabled():
        pipe = DiffusersFlux2KleinPipeline.from_pretrained(
            tiny_preset_path(), local_files_only=True
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pixels_of(seed: int, n: int = 1, height: int = 64, width: int = 96) -> torch.Tensor:
    """``[n, 3, H, W]`` in [0, 1], quantised to 8 bits as a decoded picture is."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, height, width), generator=gen).float() / 255.0


# -- encoding -------------------------------------------------------------------------------------


@torch.no_grad()
def test_encode_prompts_equals_diffusers_encode_prompt(bundle, reference) -> None:
    cond = bundle.encode_prompts(PROMPTS, negative=True)
    embeds, text_ids = reference.encode_prompt(PROMPTS, max_sequence_length=TOKENS)
    assert isinstance(cond, Flux2KleinConditions) and cond.prompt_embeds.shape == (3, TOKENS, 96)
    # unique prompts in one batch: the pipeline's computation, bit for bit
    assert torch.equal(cond.prompt_embeds, embeds)
    # the negative is "" (the pipeline's), encoded once and broadcast to every row
    neg = cond.negative_prompt_embeds
    assert torch.equal(neg[0], embeds[2]) and neg.stride(0) == 0
    # text positions are (0, 0, 0, l)
    from unirl.models.flux2.bundle import text_position_ids

    assert torch.equal(text_position_ids(TOKENS), text_ids[0])


@torch.no_grad()
def test_groups_share_one_encoding_and_the_negative_is_cached(bundle) -> None:
    cond = bundle.encode_prompts(["a cat", "a dog", "a cat"], negative=True, samples_per_prompt=2)
    rows = cond.prompt_embeds
    assert len(cond) == 6 and torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[4])
    other = bundle.encode_prompts(["a bird"], negative=True)
    assert cond.negative_prompt_embeds.data_ptr() == other.negative_prompt_embeds.data_ptr()
    # every prompt has exactly max_sequence_length tokens: rows of two requests concatenate
    both = Flux2KleinConditions.concat([cond, other])
    assert both.prompt_embeds.shape == (7, TOKENS, 96)
    assert torch.equal(both.select([6]).prompt_embeds, other.prompt_embeds)
    with pytest.raises(ValueError, match="no negative embeddings"):
        cond.positive().negative()


# -- the σ policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(64, 64), (512, 512), (1024, 1024), (1024, 1536), (2048, 2048)])
@pytest.mark.parametrize("steps", [1, 4, 10, 50])
def test_sigmas_equal_the_pipelines_for_every_resolution_and_step_count(size, steps) -> None:
    """``Flux2KleinPipeline.__call__`` gives its scheduler linspace(1, 1/T, T) pre-shift σ and
    μ = compute_empirical_mu(image tokens, T); the σ the driver authors are those, bit for bit."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    height, width = size
    tokens = (height // 16) * (width // 16)
    assert flux2_empirical_mu(tokens, steps) == compute_empirical_mu(tokens, steps)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    scheduler.set_timesteps(
        sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(tokens, steps)
    )
    ours = sigmas_from_scheduler_config(POLICY, steps, image_seq_len=tokens)
    assert torch.equal(ours, scheduler.sigmas)


def test_bundle_sigmas_depend_on_tokens_and_steps(bundle) -> None:
    assert bundle.scheduler_config["mu_policy"] == "flux2_empirical"
    assert bundle.image_seq_len(64, 64) == 16 and bundle.image_seq_len(1024, 512) == 2048
    small, large = bundle.sigmas(10, 64, 64), bundle.sigmas(10, 1024, 1024)
    assert small[0] == large[0] == 1.0 and small[-1] == large[-1] == 0.0
    assert bool((large[1:-1] > small[1:-1]).all()), "more tokens must shift σ up"
    # μ moves with the step count too: the second σ of a 4-step and a 10-step schedule at the
    # same linspace point (σ̂ = 0.5) differ
    four = sigmas_from_scheduler_config(POLICY, 4, image_seq_len=16)
    assert float(four[2]) != float(sigmas_from_scheduler_config(POLICY, 2, image_seq_len=16)[1])
    with pytest.raises(ValueError, match="mu_policy='nope'"):
        sigmas_from_scheduler_config({**POLICY, "mu_policy": "nope"}, 4, image_seq_len=16)
    with pytest.raises(ValueError, match="needs image_seq_len"):
        sigmas_from_scheduler_config(POLICY, 4)


# -- references -----------------------------------------------------------------------------------


@torch.no_grad()
def test_reference_latents_and_positions_equal_the_pipelines(bundle, reference) -> None:
    """``encode_references`` = ``prepare_image_latents`` of one reference image (VAE mode,
    patchify, batch-norm normalisation, packing; positions at time 10), per row."""
    pixels = pixels_of(0)
    cond = bundle.encode_references(bundle.encode_prompts(PROMPTS[:2]), pixels.repeat(2, 1, 1, 1))
    image = reference.image_processor.normalize(pixels)  # what preprocess hands the VAE
    latents, ids = reference.prepare_image_latents(
        images=[image], batch_size=2, generator=None, device="cpu", dtype=torch.float32
    )
    assert cond.reference_latents.shape == (2, 4 * 6, 64)
    assert torch.equal(cond.reference_latents, latents)
    assert torch.equal(cond.reference_ids, ids) and cond.reference_ids.dtype == torch.long
    assert cond.reference_ids[0, :, 0].unique().tolist() == [10]


@torch.no_grad()
def test_references_are_per_row_shared_within_groups_and_concatenate(bundle) -> None:
    a, b = pixels_of(1), pixels_of(2)
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=True, samples_per_prompt=2)
    cond = bundle.encode_references(cond, torch.cat([a, a, b, b]))
    refs = cond.reference_latents
    assert torch.equal(refs[0], refs[1]) and not torch.equal(refs[1], refs[2])
    assert cond.negative().reference_latents is refs and cond.positive().has_references
    again = bundle.encode_references(bundle.encode_prompts(["a dog"], negative=True), b)
    assert torch.equal(again.reference_latents[0], refs[3])
    both = Flux2KleinConditions.concat([cond, again])
    assert len(both) == 5 and torch.equal(
        both.select([4]).reference_latents, again.reference_latents
    )
    with pytest.raises(ValueError, match="None in some parts"):
        Flux2KleinConditions.concat([cond, bundle.encode_prompts(["a dog"], negative=True)])
    other = bundle.encode_references(
        bundle.encode_prompts(["a dog"], negative=True), pixels_of(3, height=96, width=64)
    )
    with pytest.raises(ValueError, match="share one reference grid"):
        Flux2KleinConditions.concat([cond.select([0]), other])


def test_encode_references_refuses_what_flux2_cannot_take(bundle) -> None:
    cond = bundle.encode_prompts(["a cat", "a dog"])
    for pixels, match in [
        (pixels_of(0, n=1), r"\[N=2, 3, H, W\]"),
        (pixels_of(0, n=2, height=72), "multiples of 16"),
        (pixels_of(0, n=2) * 2, r"in \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            bundle.encode_references(cond, pixels)
    with pytest.raises(ValueError, match="no reference images"):
        from unirl.models.qwen_image import QwenImageBundle

        QwenImageBundle.encode_references(bundle, cond, pixels_of(0, n=2))  # the base refusal


# -- velocity, guidance, decode -----------------------------------------------------------------------


@torch.no_grad()
def test_velocity_and_decode_match_the_pipelines_calls(bundle, reference) -> None:
    cond = bundle.encode_references(bundle.encode_prompts(PROMPTS[:2]), pixels_of(4, n=2))
    latents = torch.randn(
        2, *bundle.latent_shape(64, 128), generator=torch.Generator().manual_seed(0)
    )
    assert latents.shape == (2, 4, 8, 64)
    sigma = torch.tensor([0.75, 0.25])
    v = bundle.predict_velocity(latents, sigma, cond)
    as_diffusers = latents.permute(0, 3, 1, 2)  # [N, C, h, w] before packing
    packed = reference._pack_latents(as_diffusers)
    assert torch.equal(packed, latents.reshape(2, 32, 64))
    latent_ids = reference._prepare_latent_ids(as_diffusers)
    text_ids = reference._prepare_text_ids(cond.prompt_embeds)
    out = reference.transformer(
        hidden_states=torch.cat([packed, cond.reference_latents], dim=1),
        timestep=(sigma * 1000) / 1000,
        encoder_hidden_states=cond.prompt_embeds,
        img_ids=torch.cat([latent_ids, cond.reference_ids], dim=1),
        txt_ids=text_ids,
        guidance=None,
        return_dict=False,
    )[0]
    assert v.dtype == torch.float32 and torch.equal(v, out[:, :32].reshape(v.shape))
    # the reference tokens take part: without them the velocity differs
    plain = bundle.predict_velocity(latents, sigma, bundle.encode_prompts(PROMPTS[:2]))
    assert float((plain - v).abs().max()) > 1e-4
    # decode: unpack, un-normalise with the batch-norm statistics, unpatchify, VAE, [0, 1]
    pixels = bundle.decode(latents)
    vae = reference.vae
    z = reference._unpack_latents_with_ids(packed, latent_ids, 4, 8)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    image = vae.decode(reference._unpatchify_latents(z * std + mean), return_dict=False)[0]
    expected = reference.image_processor.postprocess(image, output_type="pt")
    assert pixels.shape == (2, 3, 64, 128) and torch.equal(pixels, expected)


def test_guidance_per_variant(bundle) -> None:
    """Distilled: one forward, CFG refused; base: v_u + g·(v_c − v_u) from two forwards."""
    assert isinstance(bundle.guidance, NoGuidance) and bundle.is_distilled
    cond = bundle.encode_prompts(["a cat"], negative=True)
    with pytest.raises(ValueError, match="guidance_scale=1"):
        bundle.guidance.forward_conditions(bundle, cond, 4.0)
    assert not bundle.guidance.forward_conditions(bundle, cond, 1.0).has_negative

    class Family:
        def predict_velocity(self, latents, sigma, conditions):
            return latents * conditions.prompt_embeds.mean()

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 3, 8, generator=gen)
    paired = Flux2KleinConditions(
        prompt_embeds=torch.randn(2, 4, 8, generator=gen),
        negative_prompt_embeds=torch.randn(2, 4, 8, generator=gen),
    )
    cfg = SeparateCFG()
    fwd = cfg.forward_conditions(None, paired, 3.0)
    v = cfg.velocity(Family(), x, torch.zeros(2), fwd, 3.0)
    v_c, v_u = x * paired.prompt_embeds.mean(), x * paired.negative_prompt_embeds.mean()
    torch.testing.assert_close(v, v_u + 3.0 * (v_c - v_u), rtol=0, atol=0)
    plain = cfg.velocity(Family(), x, torch.zeros(2), cfg.forward_conditions(None, paired, 1.0), 1)
    assert torch.equal(plain, v_c)


def test_base_variant_guides_and_replays_with_references_bit_for_bit() -> None:
    """A base checkpoint (is_distilled false) runs true CFG; a rollout with references replays
    its log-probs exactly (both guidance forwards carry the reference)."""
    base = make(path=str(tiny_preset_path(TinyFlux2Spec(is_distilled=False))))
    assert isinstance(base.guidance, SeparateCFG) and not base.is_distilled
    pipeline = Flux2KleinPipeline(bundle=base, strategy=FlowSDE(eta=0.7))
    n, steps = 4, 4
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 2,
        primitives={
            "text": Texts(texts=["a cat", "a cat", "a dog", "a dog"]),
            "image": Images(pixels=torch.cat([pixels_of(5, 2), pixels_of(6, 2)])),
        },
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor([[0, 2]] * n),
                sigmas=base.sigmas(steps, 64, 64),
                init_noise_shape=base.latent_shape(64, 64),
            )
        },
        sampling_params=DiffusionSamplingParams(
            num_inference_steps=steps, guidance_scale=3.0, height=64, width=64, samples_per_prompt=2
        ),
        seed=3,
    )
    track = pipeline.generate(req).tracks["diffusion"]
    assert track.conditions.has_negative and track.conditions.has_references
    with torch.no_grad():
        for slot in range(2):
            record = pipeline.replay(track.conditions, track.segment, slot)
            assert torch.equal(record.log_prob, track.segment.sde_logp[:, slot])
            split = pipeline.replay(track.conditions, track.segment, slot, cfg_gradient="cond_only")
            assert torch.equal(split.log_prob, track.segment.sde_logp[:, slot])


def test_tiny_stack_size(bundle) -> None:
    counts = {
        name: sum(p.numel() for p in getattr(bundle, name).parameters())
        for name in ("transformer", "vae", "text_encoder")
    }
    assert 0.8e6 <= sum(counts.values()) <= 1.5e6 and counts["transformer"] <= 0.5e6, counts


# -- SGLang ------------------------------------------------------------------------------------------


def test_sglang_maps_read_the_text_states_and_the_packed_latents() -> None:
    maps = engine_maps_for("unirl.models.flux2.Flux2KleinBundle", "sglang")
    assert isinstance(maps, Flux2KleinEngineMaps)
    with pytest.raises(ConfigError, match="vllm_omni engine has no mapper"):
        engine_maps_for(Flux2KleinBundle, "vllm_omni")
    gen = torch.Generator().manual_seed(0)
    envs = [
        {
            "pos_cond_kwargs": {
                "encoder_hidden_states": [torch.randn(1, 12, 24, generator=gen)],
                "freqs_cis": (torch.randn(28, 8), torch.randn(28, 8)),
            },
            "neg_cond_kwargs": {"encoder_hidden_states": torch.randn(12, 24, generator=gen)},
        }
        for _ in range(3)
    ]
    cond = maps.sglang_conditions(envs)
    assert cond.prompt_embeds.shape == (3, 12, 24) and cond.negative_prompt_embeds is not None
    assert torch.equal(
        cond.prompt_embeds[1], envs[1]["pos_cond_kwargs"]["encoder_hidden_states"][0][0]
    )
    distilled = maps.sglang_conditions([{"pos_cond_kwargs": e["pos_cond_kwargs"]} for e in envs])
    assert distilled.negative_prompt_embeds is None
    with pytest.raises(ValueError, match="has no 'encoder_hidden_states'"):
        maps.sglang_conditions([{"pos_cond_kwargs": {"freqs_cis": None}}])
    latents = torch.randn(2, 4, 4, 64, generator=gen)
    packed = maps.to_engine_latents(latents)
    assert packed.shape == (2, 16, 64)
    assert torch.equal(maps.from_engine_latents(packed[:, None], (4, 4, 64))[:, 0], latents)


# -- config and checks --------------------------------------------------------------------------------


def test_config_names_bad_fields() -> None:
    for kwargs, field in [
        ({"max_sequence_length": 0}, "bundle.max_sequence_length"),
        ({"dtype": "fp8"}, "bundle.dtype"),
        ({"path": ""}, "bundle.path"),
    ]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            Flux2KleinBundleConfig(**kwargs)


def test_check_config_refuses_cfg_on_a_distilled_checkpoint() -> None:
    def recipe(**sampling: Any) -> Any:
        return type("Recipe", (), {"sampling": {"height": 64, "width": 64, **sampling}})()

    with pytest.raises(
        ConfigError, match=r"sampling\.guidance_scale=4\.0 but tiny is step-distilled"
    ):
        Flux2KleinBundle.check_config({"path": "tiny"}, recipe(guidance_scale=4.0))
    with pytest.raises(ConfigError, match=r"sampling\.eval_guidance_scale=3"):
        Flux2KleinBundle.check_config({"path": "flux2-klein-arch"}, recipe(eval_guidance_scale=3))
    Flux2KleinBundle.check_config({"path": "tiny"}, recipe(guidance_scale=1.0))
    base = str(tiny_preset_path(TinyFlux2Spec(is_distilled=False)))
    Flux2KleinBundle.check_config({"path": base}, recipe(guidance_scale=4.0))


class TestFlux2KleinBundleContract(BundleContract):
    bundle_class = Flux2KleinBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": 16}
    family_label = "FLUX.2-Klein"
    arch_preset = "flux2-klein-arch"
    resolve_model_source = staticmethod(resolve_model_source)
    decoder_channel_dim = -1  # packed latents: channels last
    decoder_margin = 0.15  # at ±2 along a unit direction over 64 channels
    decoder_monotone = True

    def check_built(self, built: Flux2KleinBundle) -> None:
        assert built.encode_prompts(["a cat"]).prompt_embeds.shape == (1, 16, 96)
        assert built.takes_references
        assert built.block_class_names == ("Flux2TransformerBlock", "Flux2SingleTransformerBlock")
        built.offload()
        with pytest.raises(RuntimeError, match="onload"):
            built.encode_references(built.__class__.encode_unique(built, ["a cat"]), pixels_of(0))
        built.onload()
