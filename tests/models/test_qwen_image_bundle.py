"""QwenImageBundle against diffusers' own QwenImagePipeline pieces on the tiny preset: prompt
encoding, the σ policy, true CFG with norm rescale, packing and decode; the tiny decoder
responds to latents; config, checks and plumbing. (The shared contract — ODE sampling, ratio
1, replay, LoRA export, arch — is ``test_family_qwen_image.py``.)"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from bundle_contract import BundleContract

from unirl.config import ConfigError
from unirl.models.common.guidance import NormRescaledCFG
from unirl.models.qwen_image import (
    QwenImageBundle,
    QwenImageBundleConfig,
    QwenImageConditions,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.qwen_image.tiny import SCHEDULER_CONFIG
from unirl.sde import sigmas_from_scheduler_config

PROMPTS = ["a red fox, oil painting", 'a neon sign that says "OPEN"', ""]


@pytest.fixture(scope="module")
def bundle() -> QwenImageBundle:
    return QwenImageBundle(
        path="tiny", dtype="fp32", text_encoder_dtype="fp32", device="cpu", max_sequence_length=64
    )


@pytest.fixture(scope="module")
def reference():
    from diffusers import QwenImagePipeline as DiffusersQwenImagePipeline

    from unirl.models.common.progress import hf_progress_bars_disabled

    with hf_progress_bars_disabled():
        pipe = DiffusersQwenImagePipeline.from_pretrained(tiny_preset_path(), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def test_encode_prompts_equals_diffusers_encode_prompt(bundle, reference) -> None:
    cond = bundle.encode_prompts(PROMPTS, negative=True, negative_prompt=" ")
    embeds, mask = reference.encode_prompt(PROMPTS, max_sequence_length=64)
    assert isinstance(cond, QwenImageConditions) and cond.prompt_embeds.shape[0] == 3
    # unique prompts in one batch: the pipeline's computation, bit for bit (the mask too)
    assert torch.equal(cond.prompt_embeds, embeds) and torch.equal(cond.prompt_mask, mask)
    neg, neg_mask = reference.encode_prompt([" "], max_sequence_length=64)
    assert torch.equal(cond.negative_prompt_embeds[2], neg[0])
    assert neg_mask is None and cond.positive().prompt_mask is not None
    assert cond.negative().prompt_mask is None  # all tokens real: no mask, as diffusers passes
    # the template prefix is dropped: a longer prompt only adds tokens
    assert int(cond.prompt_mask[2].sum()) < int(cond.prompt_mask[0].sum())
    short = bundle.encode_prompts(PROMPTS[:1])
    assert short.prompt_embeds.shape[1] == int(cond.prompt_mask[0].sum())


@torch.no_grad()
def test_groups_share_one_encoding_and_the_negative_is_cached(bundle) -> None:
    cond = bundle.encode_prompts(["a cat", "a dog", "a cat"], negative=True, samples_per_prompt=2)
    rows = cond.prompt_embeds
    assert len(cond) == 6 and torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[4])
    other = bundle.encode_prompts(["a bird"], negative=True)
    assert cond.negative_prompt_embeds.data_ptr() == other.negative_prompt_embeds.data_ptr()
    with pytest.raises(TypeError, match="list of texts"):
        bundle.encode_prompts("a cat")


def test_conditions_of_different_lengths_concatenate_by_padding(bundle) -> None:
    a = bundle.encode_prompts(["a cat"], negative=True)
    b = bundle.encode_prompts(["a very small cat sitting on a big red chair"], negative=True)
    both = QwenImageConditions.concat([a, b])
    assert both.prompt_embeds.shape[1] == b.prompt_embeds.shape[1]
    assert torch.equal(
        both.prompt_mask[0],
        torch.nn.functional.pad(
            a.prompt_mask[0], (0, b.prompt_embeds.shape[1] - a.prompt_embeds.shape[1])
        ),
    )
    assert torch.equal(both.prompt_embeds[0, : a.prompt_embeds.shape[1]], a.prompt_embeds[0])
    assert float(both.prompt_embeds[0, a.prompt_embeds.shape[1] :].abs().max()) == 0.0
    assert torch.equal(both.select([1]).prompt_embeds, b.prompt_embeds)
    with pytest.raises(ValueError, match="negative"):
        a.positive().negative()


@pytest.mark.parametrize("size", [(64, 64), (512, 512), (1024, 1024), (1328, 1328), (928, 1664)])
@pytest.mark.parametrize("steps", [2, 10, 50])
def test_sigmas_equal_the_pipelines_for_every_resolution(size, steps) -> None:
    """The σ the driver authors (scheduler config + ``sigma_spacing``) are what
    ``QwenImagePipeline.__call__`` gives its scheduler: linspace(1, 1/T, T) pre-shift σ and
    μ = calculate_shift(image tokens) from the config's base / max shift and sequence lengths."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    height, width = size
    tokens = (height // 16) * (width // 16)
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
    cfg = scheduler.config
    mu = calculate_shift(
        tokens, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift
    )
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    ours = sigmas_from_scheduler_config(
        {**SCHEDULER_CONFIG, "sigma_spacing": "linspace"}, steps, image_seq_len=tokens
    )
    assert torch.equal(ours, scheduler.sigmas)


def test_bundle_sigmas_use_the_dynamic_shift(bundle) -> None:
    assert bundle.scheduler_config["sigma_spacing"] == "linspace"
    assert bundle.image_seq_len(64, 64) == 16 and bundle.image_seq_len(1024, 512) == 2048
    small, large = bundle.sigmas(10, 64, 64), bundle.sigmas(10, 1024, 1024)
    assert small[0] == large[0] == 1.0 and small[-2] == large[-2] == pytest.approx(0.02)
    assert bool((large[1:-2] > small[1:-2]).all()), "more tokens must shift σ up"


def test_norm_rescaled_cfg_is_the_pipelines_formula() -> None:
    """c = v_u + g·(v_c − v_u), then c·‖v_c‖/‖c‖ per token over the channel dim."""

    class Family:
        def predict_velocity(self, latents, sigma, conditions):
            return latents * conditions

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 3, 8, generator=gen)
    cond, uncond = torch.randn(2, 3, 3, 8, generator=gen), torch.randn(2, 3, 3, 8, generator=gen)
    v = NormRescaledCFG().velocity(Family(), x, torch.zeros(2), (cond, uncond), 4.0)
    v_c, v_u = (x * cond).double(), (x * uncond).double()
    c = v_u + 4.0 * (v_c - v_u)
    expected = c * v_c.norm(dim=-1, keepdim=True) / c.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(v.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v.norm(dim=-1), (x * cond).norm(dim=-1), rtol=1e-5, atol=1e-6)
    plain = NormRescaledCFG().velocity(Family(), x, torch.zeros(2), cond, 1.0)
    assert torch.equal(plain, x * cond)


@torch.no_grad()
def test_velocity_and_decode_match_the_pipelines_calls(bundle, reference) -> None:
    cond = bundle.encode_prompts(PROMPTS[:2]).positive()
    latents = torch.randn(
        2, *bundle.latent_shape(64, 128), generator=torch.Generator().manual_seed(0)
    )
    assert latents.shape == (2, 4, 8, 64)
    sigma = torch.tensor([0.75, 0.25])
    v = bundle.predict_velocity(latents, sigma, cond)
    packed = latents.reshape(2, 32, 64)
    ref = reference.transformer(
        hidden_states=packed,
        timestep=(sigma * 1000) / 1000,
        encoder_hidden_states=cond.prompt_embeds,
        encoder_hidden_states_mask=cond.prompt_mask,
        img_shapes=[[(1, 4, 8)]] * 2,
        return_dict=False,
    )[0]
    assert v.dtype == torch.float32 and torch.equal(v, ref.reshape(v.shape))
    # packing is diffusers': our unpack inverts its _pack_latents
    vae_latents = bundle.unpack(latents)
    repacked = reference._pack_latents(vae_latents[:, :, 0], 2, 16, 8, 16)
    assert torch.equal(repacked, packed)
    pixels = bundle.decode(latents)
    vae = reference.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    image = vae.decode(vae_latents / std + mean, return_dict=False)[0][:, :, 0]
    expected = reference.image_processor.postprocess(image, output_type="pt")
    assert pixels.shape == (2, 3, 64, 128) and torch.equal(pixels, expected)


def test_tiny_stack_size(bundle) -> None:
    counts = {
        name: sum(p.numel() for p in getattr(bundle, name).parameters())
        for name in ("transformer", "vae", "text_encoder")
    }
    assert 0.3e6 <= sum(counts.values()) <= 1.5e6 and counts["transformer"] <= 0.5e6, counts


def test_config_names_bad_fields() -> None:
    for kwargs, field in [
        ({"max_sequence_length": 2048}, "bundle.max_sequence_length"),
        ({"dtype": "fp8"}, "bundle.dtype"),
        ({"path": ""}, "bundle.path"),
        ({"decode_chunk_size": 0}, "bundle.decode_chunk_size"),
    ]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            QwenImageBundleConfig(**kwargs)


def test_check_config_takes_the_released_sizes() -> None:
    QwenImageBundle.check_config(
        {"path": "qwen-image-arch"}, type("R", (), {"sampling": {"height": 512, "width": 928}})()
    )


class TestQwenImageBundleContract(BundleContract):
    bundle_class = QwenImageBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": 16}
    family_label = "Qwen-Image"
    arch_preset = "qwen-image-arch"
    resolve_model_source = staticmethod(resolve_model_source)
    decoder_channel_dim = -1  # packed latents: channels last

    def check_built(self, built: QwenImageBundle) -> None:
        assert built.block_class_names == ("QwenImageTransformerBlock",)
