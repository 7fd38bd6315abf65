"""SD3Bundle against diffusers' own StableDiffusion3Pipeline on the tiny preset: prompt
encoding, velocity call, latent geometry and decode; config validation and plumbing."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from unirl.config import ConfigError
from unirl.models.sd3 import SD3Bundle, SD3BundleConfig, SD3Conditions

PROMPTS = ["a red fox, oil painting", 'a neon sign that says "OPEN"', ""]


@torch.no_grad()
def test_encode_prompts_equals_diffusers_encode_prompt(tiny_sd3_bundle, tiny_sd3_diffusers_pipe):
    cond = tiny_sd3_bundle.encode_prompts(PROMPTS, negative=True, samples_per_prompt=2)
    pe, npe, pooled, npooled = tiny_sd3_diffusers_pipe.encode_prompt(
        PROMPTS,
        None,
        None,
        device=torch.device("cpu"),
        num_images_per_prompt=2,
        do_classifier_free_guidance=True,
        max_sequence_length=256,
    )
    assert cond.prompt_embeds.shape == (6, 77 + 256, 96) and cond.pooled_prompt_embeds.shape == (
        6,
        80,
    )
    # Unique prompts in one batch: the same computation as diffusers, bit for bit.
    assert torch.equal(cond.prompt_embeds, pe)
    assert torch.equal(cond.pooled_prompt_embeds, pooled)
    # The negative is encoded once (batch 1) where diffusers encodes one copy per prompt, so
    # float summation order may differ in the last bits.
    torch.testing.assert_close(cond.negative_prompt_embeds, npe, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cond.negative_pooled_prompt_embeds, npooled, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_encode_prompts_with_max_sequence_length_128(make_tiny_sd3, tiny_sd3_diffusers_pipe):
    bundle = make_tiny_sd3(max_sequence_length=128)
    cond = bundle.encode_prompts(PROMPTS[:2], negative=False)
    pe, _, pooled, _ = tiny_sd3_diffusers_pipe.encode_prompt(
        PROMPTS[:2], None, None, do_classifier_free_guidance=False, max_sequence_length=128
    )
    assert cond.prompt_embeds.shape == (2, 77 + 128, 96) and cond.negative_prompt_embeds is None
    assert torch.equal(cond.prompt_embeds, pe) and torch.equal(cond.pooled_prompt_embeds, pooled)


@torch.no_grad()
def test_groups_share_one_encoding(tiny_sd3_bundle, tiny_sd3_diffusers_pipe):
    texts = ["a cat", "a dog", "a cat"]
    cond = tiny_sd3_bundle.encode_prompts(texts, negative=False, samples_per_prompt=3)
    assert len(cond) == 9
    rows = cond.prompt_embeds
    for group in range(3):  # the samples of one group are bit-identical
        for k in range(1, 3):
            assert torch.equal(rows[3 * group], rows[3 * group + k])
    assert torch.equal(rows[0], rows[6]), "a repeated prompt must reuse its encoding"
    assert not torch.allclose(rows[0], rows[3])
    pe, _, pooled, _ = tiny_sd3_diffusers_pipe.encode_prompt(
        texts, None, None, do_classifier_free_guidance=False
    )
    # Deduplication changes the encoder batch size, hence float summation order: allclose.
    torch.testing.assert_close(rows[::3], pe, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cond.pooled_prompt_embeds[::3], pooled, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_negative_encoding_is_cached_and_broadcast(make_tiny_sd3):
    bundle = make_tiny_sd3()
    a = bundle.encode_prompts(["a cat"], negative=True, samples_per_prompt=4)
    b = bundle.encode_prompts(["a dog", "a bird"], negative=True)
    assert a.negative_prompt_embeds.data_ptr() == b.negative_prompt_embeds.data_ptr(), (
        "encoded twice"
    )
    empty = bundle.encode_prompts([""], negative=False)
    assert torch.equal(a.negative_prompt_embeds[3], empty.prompt_embeds[0])
    custom = bundle.encode_prompts(["a cat"], negative_prompt="blurry")
    assert custom.has_negative and not torch.equal(
        custom.negative_prompt_embeds, a.negative_prompt_embeds[:1]
    )
    with pytest.raises(TypeError, match="list of texts"):
        bundle.encode_prompts("a cat", negative=False)


@torch.no_grad()
def test_cfg_conditions_put_negative_rows_first(tiny_sd3_bundle):
    cond = tiny_sd3_bundle.encode_prompts(["a cat", "a dog"], negative=True)
    pairs = tiny_sd3_bundle.cfg_conditions(cond)
    assert isinstance(pairs, SD3Conditions) and len(pairs) == 4 and not pairs.has_negative
    assert torch.equal(pairs.prompt_embeds[:2], cond.negative_prompt_embeds)
    assert torch.equal(pairs.prompt_embeds[2:], cond.prompt_embeds)
    assert torch.equal(pairs.pooled_prompt_embeds[:2], cond.negative_pooled_prompt_embeds)
    # Batch plumbing keeps negatives aligned with their rows.
    picked = cond.select([1])
    assert torch.equal(picked.negative_prompt_embeds[0], cond.negative_prompt_embeds[1])
    with pytest.raises(ValueError, match="negative"):
        cond.positive().cfg_pairs()


@torch.no_grad()
def test_predict_velocity_matches_the_diffusers_transformer_call(
    tiny_sd3_bundle, tiny_sd3_diffusers_pipe
):
    bundle = tiny_sd3_bundle
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=False)
    latents = torch.randn(
        2, *bundle.latent_shape(64, 64), generator=torch.Generator().manual_seed(0)
    )
    sigma = torch.tensor([0.75, 0.25])
    v = bundle.predict_velocity(latents, sigma, cond)
    ref = tiny_sd3_diffusers_pipe.transformer(
        hidden_states=latents,
        encoder_hidden_states=cond.prompt_embeds,
        pooled_projections=cond.pooled_prompt_embeds,
        timestep=sigma * 1000,
        return_dict=False,
    )[0]
    assert v.dtype == torch.float32 and v.shape == latents.shape
    assert torch.equal(v, ref)
    scalar = bundle.predict_velocity(latents, 0.75, cond)
    assert torch.equal(scalar[0], v[0])
    with pytest.raises(ValueError, match="condition rows"):
        bundle.predict_velocity(latents[:1], 0.5, cond)
    with pytest.raises(ValueError, match="sigma has 3 values"):
        bundle.predict_velocity(latents, torch.ones(3), cond)


@torch.no_grad()
def test_bf16_transformer_returns_fp32_close_to_fp32(make_tiny_sd3, tiny_sd3_bundle):
    bf16 = make_tiny_sd3(dtype="bfloat16")
    assert (
        bf16.config.dtype == "bf16" and next(bf16.transformer.parameters()).dtype == torch.bfloat16
    )
    cond = tiny_sd3_bundle.encode_prompts(["a cat"], negative=False)
    latents = torch.randn(1, *bf16.latent_shape(64, 64), generator=torch.Generator().manual_seed(0))
    v16 = bf16.predict_velocity(latents, 0.5, cond)
    v32 = tiny_sd3_bundle.predict_velocity(latents, 0.5, cond)
    assert v16.dtype == torch.float32
    assert ((v16 - v32).norm() / v32.norm()) < 0.05


def test_latent_shape_and_geometry(tiny_sd3_bundle):
    assert tiny_sd3_bundle.latent_shape(64, 64) == (16, 8, 8)
    assert tiny_sd3_bundle.latent_shape(128, 64) == (16, 16, 8)
    assert tiny_sd3_bundle.image_seq_len(64, 64) == 16
    with pytest.raises(ValueError, match=r"sampling\.height=72"):
        tiny_sd3_bundle.latent_shape(72, 64)
    assert tiny_sd3_bundle.scheduler_config["shift"] == 3.0
    assert tiny_sd3_bundle.scheduler_config["_class_name"] == "FlowMatchEulerDiscreteScheduler"
    assert tiny_sd3_bundle.trainable_module is tiny_sd3_bundle.transformer
    assert tiny_sd3_bundle.block_class_names == ("JointTransformerBlock",)
    blocks = {type(m).__name__ for m in tiny_sd3_bundle.transformer.modules()}
    assert "JointTransformerBlock" in blocks


@torch.no_grad()
def test_decode_matches_diffusers_and_is_chunk_invariant(make_tiny_sd3, tiny_sd3_diffusers_pipe):
    bundle = make_tiny_sd3(decode_chunk_size=2)
    latents = torch.randn(5, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    pixels = bundle.decode(latents)
    assert pixels.shape == (5, 3, 64, 64) and pixels.dtype == torch.float32
    assert pixels.min() >= 0 and pixels.max() <= 1
    vae = tiny_sd3_diffusers_pipe.vae
    z = latents / vae.config.scaling_factor + vae.config.shift_factor
    ref = tiny_sd3_diffusers_pipe.image_processor.postprocess(
        vae.decode(z, return_dict=False)[0], output_type="pt"
    )
    torch.testing.assert_close(pixels, ref, rtol=0, atol=1e-5)
    whole = make_tiny_sd3(decode_chunk_size=8).decode(latents)
    torch.testing.assert_close(pixels, whole, rtol=0, atol=1e-5)


@torch.no_grad()
def test_skip_t5_matches_diffusers_without_text_encoder_3(make_tiny_sd3, tiny_sd3_diffusers_pipe):
    from diffusers import StableDiffusion3Pipeline

    bundle = make_tiny_sd3(skip_t5=True)
    assert bundle.text_encoder_3 is None and bundle.tokenizer_3 is None
    cond = bundle.encode_prompts(PROMPTS[:2], negative=True)
    ref = StableDiffusion3Pipeline(
        **{**tiny_sd3_diffusers_pipe.components, "text_encoder_3": None, "tokenizer_3": None}
    )
    pe, npe, pooled, _ = ref.encode_prompt(PROMPTS[:2], None, None, max_sequence_length=256)
    assert torch.equal(cond.prompt_embeds, pe) and torch.equal(cond.pooled_prompt_embeds, pooled)
    torch.testing.assert_close(cond.negative_prompt_embeds, npe, rtol=1e-5, atol=1e-5)
    assert cond.prompt_embeds[:, 77:].abs().max() == 0

    rand = make_tiny_sd3(skip_t5=True, t5_placeholder="random")
    one = rand.encode_prompts(["a cat", "a dog"], negative=False).prompt_embeds[:, 77:]
    two = rand.encode_prompts(["a cat"], negative=False).prompt_embeds[:, 77:]
    assert one.std() > 0.5 and torch.equal(one[0], two[0]) and not torch.equal(one[0], one[1])


def test_offload_and_onload(make_tiny_sd3):
    bundle = make_tiny_sd3()
    bundle.offload()
    assert next(bundle.text_encoder.parameters()).device.type == "cpu"
    with pytest.raises(RuntimeError, match="onload"):
        bundle.encode_prompts(["a cat"], negative=False)
    with pytest.raises(RuntimeError, match="onload"):
        bundle.decode(torch.zeros(1, 16, 8, 8))
    bundle.onload()
    assert len(bundle.encode_prompts(["a cat"], negative=False)) == 1
    assert bundle.to("cpu") is bundle and bundle.device == torch.device("cpu")


def test_gradient_checkpointing_flag(make_tiny_sd3):
    assert make_tiny_sd3(gradient_checkpointing=True).transformer.gradient_checkpointing
    assert not make_tiny_sd3().transformer.gradient_checkpointing


def test_config_normalises_precision_and_names_bad_fields():
    cfg = SD3BundleConfig(dtype="bfloat16", text_encoder_dtype="float16", vae_dtype="float32")
    assert (cfg.dtype, cfg.text_encoder_dtype, cfg.vae_dtype) == ("bf16", "fp16", "fp32")
    bad = [
        ({"dtype": "fp8"}, "bundle.dtype"),
        ({"vae_dtype": "half"}, "bundle.vae_dtype"),
        ({"text_encoder_dtype": "int8"}, "bundle.text_encoder_dtype"),
        ({"device": "gpu0"}, "bundle.device"),
        ({"max_sequence_length": 0}, "bundle.max_sequence_length"),
        ({"t5_placeholder": "ones"}, "bundle.t5_placeholder"),
        ({"sdpa_backend": "xformers"}, "bundle.sdpa_backend"),
        ({"decode_chunk_size": 0}, "bundle.decode_chunk_size"),
        ({"path": ""}, "bundle.path"),
    ]
    for kwargs, field in bad:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            SD3BundleConfig(**kwargs)
    with pytest.raises(TypeError):
        SD3BundleConfig(dtpye="bf16")  # misspelt keys are errors, not ignored


def test_bundle_keywords_mirror_the_config_dataclass():
    params = inspect.signature(SD3Bundle.__init__).parameters
    kw = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    fields = {f.name: f.default for f in dataclasses.fields(SD3BundleConfig)}
    assert kw == fields
    assert SD3Bundle.config_class is SD3BundleConfig


def test_hydra_instantiates_the_bundle_from_a_recipe_block(tiny_sd3_path):
    instantiate = pytest.importorskip("hydra.utils", reason="hydra-core not installed").instantiate

    block = {
        "_target_": "unirl.models.sd3.SD3Bundle",
        "path": "tiny",
        "dtype": "fp32",
        "text_encoder_dtype": "fp32",
        "device": "cpu",
        "max_sequence_length": 128,
    }
    bundle = instantiate(block, _convert_="object")
    assert isinstance(bundle, SD3Bundle) and bundle.source == tiny_sd3_path
    assert bundle.config.max_sequence_length == 128


@torch.no_grad()
def test_compiled_vae_decoder_decodes_like_eager(make_tiny_sd3):
    """``compile_vae`` wraps the decoder in ``torch.compile``; the pixels stay the eager ones."""
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    eager = make_tiny_sd3(decode_chunk_size=2).decode(latents)
    bundle = make_tiny_sd3(decode_chunk_size=2, compile_vae=True)
    assert bundle.vae.decoder._compiled_call_impl is not None
    torch.testing.assert_close(bundle.decode(latents), eager, rtol=0, atol=1e-5)
