"""HunyuanVideo15Bundle against diffusers' own HunyuanVideo 1.5 pipeline pieces on the tiny
preset: both prompt encodings, the template's crop, the σ policy, the velocity call, video
geometry, the tiny decoder, and the refusals. (The shared contract — ODE sampling, ratio 1,
replay, LoRA export, arch — is ``test_family_hunyuan_video.py``.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from unirl.config import ConfigError
from unirl.models.common.presets import ModelSourceError
from unirl.models.hunyuan_video import (
    HunyuanVideo15Bundle,
    HunyuanVideo15BundleConfig,
    HunyuanVideo15Conditions,
    pipeline_prompt_template,
    tiny_preset_path,
)
from unirl.sde import sigmas_from_scheduler_config
from unirl.types import DiffusionSamplingParams

PROMPTS = ['a neon sign that says "OPEN" and “CAFE”', "a red fox, oil painting", ""]
TEXT_TOKENS = 32
GLYPH_TOKENS = 16
H, W, FRAMES = 32, 48, 5


def make(**overrides: object) -> HunyuanVideo15Bundle:
    kwargs: dict = {
        "path": "tiny",
        "dtype": "fp32",
        "text_encoder_dtype": "fp32",
        "device": "cpu",
        "max_sequence_length": TEXT_TOKENS,
        "glyph_max_sequence_length": GLYPH_TOKENS,
        "image_tokens": 0,
    }
    return HunyuanVideo15Bundle(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def bundle() -> HunyuanVideo15Bundle:
    return make()


@pytest.fixture(scope="module")
def reference():
    from diffusers import HunyuanVideo15Pipeline

    from unirl.models.common.progress import hf_progress_bars_disabled

    with hf_progress_bars_disabled():
        pipe = HunyuanVideo15Pipeline.from_pretrained(tiny_preset_path(), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# -- encoding ----------------------------------------------------------------------------------


def test_defaults_are_the_pipelines(reference) -> None:
    """The config's lengths and image slots, and the template the encoder reads, are the
    pipeline's own (read from the loaded pipeline object)."""
    config = HunyuanVideo15BundleConfig()
    template = pipeline_prompt_template()
    assert config.max_sequence_length == reference.tokenizer_max_length == 1000
    assert config.glyph_max_sequence_length == reference.tokenizer_2_max_length == 256
    assert config.image_tokens == reference.vision_num_semantic_tokens == 729
    assert template.crop_start == reference.prompt_template_encode_start_idx == 108
    assert template.system_message == reference.system_message


@torch.no_grad()
def test_encode_prompts_equals_the_pipelines_encode_prompt(bundle, reference) -> None:
    reference.tokenizer_max_length = TEXT_TOKENS
    reference.tokenizer_2_max_length = GLYPH_TOKENS
    cond = bundle.encode_prompts(PROMPTS, negative=True, negative_prompt="blurry")
    embeds, mask, glyph, glyph_mask = reference.encode_prompt(
        PROMPTS, device=torch.device("cpu"), dtype=torch.float32, batch_size=3
    )
    neg = reference.encode_prompt(["blurry"], device=torch.device("cpu"), dtype=torch.float32)
    assert isinstance(cond, HunyuanVideo15Conditions)
    assert cond.prompt_embeds.shape == (3, TEXT_TOKENS, 32)
    assert cond.glyph_embeds.shape == (3, GLYPH_TOKENS, 24)
    assert torch.equal(cond.prompt_embeds, embeds) and torch.equal(cond.prompt_mask, mask.long())
    assert torch.equal(cond.glyph_embeds, glyph) and torch.equal(cond.glyph_mask, glyph_mask.long())
    assert torch.equal(cond.negative_prompt_embeds[0], neg[0][0])
    assert torch.equal(cond.negative_glyph_mask[1], neg[3][0].long())
    # quoted texts reach the glyph encoder; a prompt without any has zero rows and mask
    assert int(cond.glyph_mask[0].sum()) == GLYPH_TOKENS  # 'Text "OPEN". Text "CAFE". ' is cut
    assert not cond.glyph_mask[1].any() and not cond.glyph_embeds[1].any()
    pairs = bundle.cfg_conditions(cond)
    assert torch.equal(pairs.prompt_embeds[3:], embeds) and len(pairs) == 6


def test_the_crop_drops_exactly_the_system_turn(bundle) -> None:
    """The tiny tokenizer splits the chat turn's prefix into the pipeline's 108 tokens, as the
    released one does: the kept tokens start with the prompt's first word."""
    tokenizer = bundle.tokenizer
    template = pipeline_prompt_template()
    tokens = tokenizer.apply_chat_template(
        [
            [
                {"role": "system", "content": template.system_message},
                {"role": "user", "content": "a sunset over the sea"},
            ]
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"][0]
    kept = tokenizer.decode(tokens[template.crop_start :])
    assert kept == "a sunset over the sea<|im_end|>\n<|im_start|>assistant\n", kept
    assert tokenizer.decode(tokens[template.crop_start - 2 : template.crop_start]) == "user\n"


def test_groups_share_one_encoding_and_the_negative_is_cached(bundle) -> None:
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=True, samples_per_prompt=2)
    assert len(cond) == 4 and torch.equal(cond.prompt_embeds[0], cond.prompt_embeds[1])
    other = bundle.encode_prompts(["a bird"], negative=True)
    assert cond.negative_prompt_embeds.data_ptr() == other.negative_prompt_embeds.data_ptr()


# -- the σ policy and the velocity --------------------------------------------------------------


def test_sigmas_equal_the_schedulers_for_the_pipelines_spacing(bundle, reference) -> None:
    """The pipeline hands the scheduler linspace(1, 0, T + 1)[:-1]; ``sigma_spacing: linspace``
    gives the same σ bit for bit (float64 linspaces differ in the last bit, float32 does not)."""
    assert bundle.scheduler_config["shift"] == 5.0
    assert bundle.scheduler_config["sigma_spacing"] == "linspace"
    for steps in (1, 3, 7, 10, 28, 50):
        reference.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
        assert torch.equal(bundle.sigmas(steps, H, W), reference.scheduler.sigmas.float()), steps
    shifted = make(flow_shift=9.0)
    assert torch.equal(
        shifted.sigmas(8, H, W),
        sigmas_from_scheduler_config(
            {"num_train_timesteps": 1000, "shift": 9.0, "sigma_spacing": "linspace"}, 8
        ),
    )


@torch.no_grad()
def test_velocity_is_the_transformer_called_as_the_pipeline_calls_it(bundle) -> None:
    cond = bundle.encode_prompts(PROMPTS[:2])
    x = torch.randn(2, 32, 2, 2, 3, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.8, 0.3])
    v = bundle.predict_velocity(x, sigma, cond)
    hidden = torch.cat([x, torch.zeros(2, 33, 2, 2, 3)], dim=1)
    for slots in (0, 729):  # the image slots are zero and masked: they change nothing
        theirs = bundle.transformer(
            hidden_states=hidden,
            timestep=sigma * 1000,
            encoder_hidden_states=cond.prompt_embeds,
            encoder_attention_mask=cond.prompt_mask.float(),
            encoder_hidden_states_2=cond.glyph_embeds,
            encoder_attention_mask_2=cond.glyph_mask.float(),
            image_embeds=torch.zeros(2, slots, 16),
            return_dict=False,
        )[0]
        assert float((v - theirs).abs().max()) <= 1e-6, slots
    assert torch.equal(v, make(image_tokens=0).predict_velocity(x, sigma, cond))
    with pytest.raises(ValueError, match=r"2 latents but 1 condition rows"):
        bundle.predict_velocity(x, sigma, cond.select(torch.tensor([0])))


# -- geometry and decode ------------------------------------------------------------------------


def test_video_geometry_and_its_refusals(bundle) -> None:
    params = DiffusionSamplingParams(height=H, width=W, num_frames=FRAMES)
    assert bundle.latent_shape_for(params) == (32, 2, 2, 3)
    assert bundle.latent_shape_for(
        DiffusionSamplingParams(height=480, width=848, num_frames=121)
    ) == (32, 31, 30, 53)
    assert bundle.latent_shape(H, W) == (32, 1, 2, 3) and bundle.image_seq_len(H, W) == 6
    with pytest.raises(ConfigError, match=r"num_frames=6 must be 4·k \+ 1.*use 5 or 9"):
        bundle.latent_shape_for(DiffusionSamplingParams(height=H, width=W, num_frames=6))
    with pytest.raises(ValueError, match=r"multiples of 16"):
        bundle.latent_shape_for(DiffusionSamplingParams(height=40, width=W, num_frames=5))


def test_tiny_decoder_moves_every_frame_with_the_latent(bundle) -> None:
    """Along the latent direction that raises the mean brightness, every decoded frame's
    brightness rises monotonically (corr > 0.95, by more than 0.05), so pixel rewards can learn;
    a latent constant over space decodes to flat frames (no sub-pixel pattern), the first
    frame included."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(1, 32, 2, 2, 3, generator=gen)
    probe = base.clone().requires_grad_(True)
    bundle.decode(probe).mean().backward()
    direction = probe.grad / probe.grad.norm()
    scales = torch.linspace(-3.0, 3.0, 7)
    with torch.no_grad():
        videos = bundle.decode(torch.cat([base + s * direction for s in scales]))
        assert videos.shape == (7, FRAMES, 3, H, W) and videos.dtype == torch.float32
        brightness = videos.mean(dim=(2, 3, 4))  # [7, T]
        for t in range(FRAMES):
            corr = np.corrcoef(scales.numpy(), brightness[:, t].numpy())[0, 1]
            assert corr > 0.95, (t, corr)
            assert float(brightness[-1, t] - brightness[0, t]) > 0.05, t
        flat = bundle.decode(torch.randn(1, 32, 1, 1, 1, generator=gen).expand(1, 32, 2, 2, 3))
        assert float(flat.std(dim=(3, 4)).max()) <= 1e-6  # float rounding only
        assert float(videos.std(dim=(3, 4)).min()) > 0.01  # a varying latent varies the frames


# -- refusals before anything is built -----------------------------------------------------------


def recipe(**blocks: object) -> SimpleNamespace:
    return SimpleNamespace(**{"sampling": {}, "backend": {}, **blocks})


def test_check_config_names_the_field_and_the_fix() -> None:
    HunyuanVideo15Bundle.check_config(
        {"path": "hunyuan-video-1.5-arch"},
        recipe(sampling={"num_frames": 121, "height": 480, "width": 848}),
    )
    with pytest.raises(ConfigError, match=r"num_frames=120 must be 4·k \+ 1"):
        HunyuanVideo15Bundle.check_config({"path": "tiny"}, recipe(sampling={"num_frames": 120}))
    with pytest.raises(ConfigError, match=r"sampling.width=40 is not a multiple of 16"):
        HunyuanVideo15Bundle.check_config({"path": "tiny"}, recipe(sampling={"width": 40}))
    with pytest.raises(ConfigError, match=r"bundle.path: .*path=hunyuan-video-1.5-arch"):
        HunyuanVideo15Bundle.check_config({"path": "./no/such/folder"}, recipe())
    module = HunyuanVideo15Bundle.trainable_on_meta({"path": "tiny"})
    names = {name.rsplit(".", 1)[-1] for name, _ in module.named_modules()}
    names |= {
        name.rsplit(".", 2)[-2] + ".0"
        for name, _ in module.named_modules()
        if name.endswith("to_out.0")
    }
    assert set(HunyuanVideo15Bundle.lora_default_targets) <= names


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("image_tokens", -1, r"image_tokens"),
        ("flow_shift", 0.0, r"bundle.flow_shift=0.0 must be > 0"),
        ("max_sequence_length", 0, r"max_sequence_length"),
    ],
)
def test_config_refuses_bad_fields(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HunyuanVideo15BundleConfig(**{field: value})


def test_other_pipelines_are_refused_at_load(tmp_path: Path) -> None:
    """An image-to-video folder (or any other pipeline class) is refused in one line."""
    folder = tmp_path / "i2v"
    folder.mkdir()
    source = tiny_preset_path()
    for part in source.iterdir():
        if part.is_dir():
            (folder / part.name).symlink_to(part)
    index = json.loads((source / "model_index.json").read_text())
    index["_class_name"] = "HunyuanVideo15ImageToVideoPipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(
        ConfigError, match=r"HunyuanVideo15ImageToVideoPipeline checkpoint.*text-to-video"
    ):
        make(path=str(folder))
    with pytest.raises(ModelSourceError, match=r"not a diffusers HunyuanVideo 1.5 layout"):
        make(path=str(tmp_path))
