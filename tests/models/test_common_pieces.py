"""The pieces of ``unirl.models.common`` the diffusion families share (folded out of them):
each is checked here on its own; the family testers prove the families still match diffusers
bit for bit through them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from unirl.models.common.tiny_vae import TinyKLVAE
from unirl.models.flux2.tiny import TinyFlux2Spec
from unirl.models.sd3.tiny import TinySD3Spec, vae_config
from unirl.models.z_image.tiny import TinyZImageSpec

# -- tiny_vae ------------------------------------------------------------------------------------


def test_tiny_kl_vae_reads_a_family_spec_by_field_name() -> None:
    vae = TinyKLVAE.from_spec(TinyZImageSpec())
    assert (vae.spec_name, vae.latent_sample_size, vae.decoder_gain) == ("TinyZImageSpec", 8, 0.6)
    assert (vae.scaling_factor, vae.shift_factor) == (0.3611, 0.1159)
    config = TinyKLVAE.from_spec(TinySD3Spec(), latent_sample_size=8).config()
    assert config == vae_config(TinySD3Spec())
    assert config["block_out_channels"] == (32, 32, 32, 32) and config["sample_size"] == 64
    # FLUX.2's spec has no scaling / shift: they must be given
    with pytest.raises(AttributeError, match="scaling_factor"):
        TinyKLVAE.from_spec(TinyFlux2Spec(), latent_sample_size=8)
    with pytest.raises(TypeError, match="unknown fields \\['gain'\\]"):
        TinyKLVAE.from_spec(TinySD3Spec(), latent_sample_size=8, gain=1.0)


def test_tiny_kl_vae_names_the_family_spec_in_a_bad_size() -> None:
    from diffusers import AutoencoderKL

    vae = TinyKLVAE.from_spec(
        TinyZImageSpec(decoder_anchor_channels=3), latent_sample_size=2, vae_levels=2
    )
    decoder = AutoencoderKL(**vae.config()).decoder
    with pytest.raises(
        ValueError, match=r"^TinyZImageSpec: decoder_anchor_channels=3 must be even"
    ):
        vae.shape_decoder(decoder, torch.Generator().manual_seed(0))


@torch.no_grad()
def test_tiny_kl_vae_shaped_decoder_is_centred_and_moves_with_the_latent() -> None:
    from diffusers import AutoencoderKL

    vae = TinyKLVAE.from_spec(TinySD3Spec(), latent_sample_size=4, vae_levels=2)
    torch.manual_seed(0)
    model = AutoencoderKL(**vae.config()).eval()
    vae.shape_decoder(model.decoder, torch.Generator().manual_seed(1))
    z = torch.randn(32, 16, 4, 4, generator=torch.Generator().manual_seed(2))
    pixels = model.decoder(z / vae.scaling_factor + vae.shift_factor)
    assert pixels.mean(dim=(0, 2, 3)).abs().max() < 0.08  # centred on mid-grey (0 in [-1, 1])
    direction = torch.randn(16, 1, 1, generator=torch.Generator().manual_seed(3))
    brightness = [
        model.decoder((z + t * direction) / vae.scaling_factor + vae.shift_factor).mean()
        for t in (-1.0, 0.0, 1.0)
    ]
    assert abs(float(brightness[2] - brightness[0])) > 0.4  # unshaped: 0.08
    assert torch.stack(brightness).diff().sign().unique().numel() == 1  # monotone


# -- arch ----------------------------------------------------------------------------------------


def test_build_seeded_seeds_each_part_in_its_dtype_and_leaves_global_state_alone() -> None:
    from unirl.models.common.arch import build_seeded, count_params_on_meta

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    cpu = torch.device("cpu")
    parts = build_seeded(
        [
            ("a", lambda: torch.nn.Linear(4, 3), torch.bfloat16),
            ("b", lambda: torch.nn.Linear(4, 3).train(), torch.float64),
        ],
        device=cpu,
        seed=7,
    )
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.get_default_dtype() == torch.float32
    assert parts["a"].weight.dtype == torch.bfloat16 and parts["b"].weight.dtype == torch.float64
    assert not parts["a"].training and not parts["b"].training
    torch.manual_seed(8)  # part 1 is seeded with seed + 1
    expected = torch.nn.Linear(4, 3).to(torch.float64)
    assert not torch.equal(parts["b"].weight, expected.weight)  # built in float64, not cast
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(8)
        torch.set_default_dtype(torch.float64)
        try:
            direct = torch.nn.Linear(4, 3)
        finally:
            torch.set_default_dtype(torch.float32)
    assert torch.equal(parts["b"].weight, direct.weight)
    counts = count_params_on_meta(
        {"a": lambda: torch.nn.Linear(4, 3), "b": lambda: torch.nn.Conv2d(2, 5, 3)}
    )
    assert counts == {"a": 15, "b": 95}


# -- folders -------------------------------------------------------------------------------------


def test_load_parts_builds_arch_specs_on_the_device_and_reads_folders(tmp_path) -> None:
    from types import SimpleNamespace

    from unirl.models.common.arch import ArchSpec
    from unirl.models.common.folders import load_parts

    bundle = SimpleNamespace(
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        text_encoder_dtype=torch.float16,
        vae_dtype=torch.float32,
    )
    calls: list[tuple[str, object]] = []

    def build_arch(spec: ArchSpec, **kwargs: object) -> dict:
        calls.append(("arch", (spec.name, kwargs)))
        return {"built": spec.name}

    def read_folder(folder, got_bundle) -> dict:
        calls.append(("folder", (folder, got_bundle is bundle)))
        return {"read": str(folder)}

    spec = ArchSpec(name="x-arch", transformer={}, vae={})
    assert load_parts(bundle, spec, build_arch=build_arch, read_folder=read_folder) == {
        "built": "x-arch"
    }
    assert load_parts(bundle, tmp_path, build_arch=build_arch, read_folder=read_folder) == {
        "read": str(tmp_path)
    }
    assert calls == [
        (
            "arch",
            (
                "x-arch",
                {
                    "device": torch.device("cpu"),
                    "dtype": torch.bfloat16,
                    "text_encoder_dtype": torch.float16,
                    "vae_dtype": torch.float32,
                },
            ),
        ),
        ("folder", (tmp_path, True)),
    ]


# -- presets -------------------------------------------------------------------------------------


def test_model_sources_resolve_and_arch_spec(tmp_path, monkeypatch) -> None:
    from unirl.models.common.presets import ModelSourceError, ModelSources

    sources = ModelSources(family="Toy", arch_presets=("toy-arch",), components=("transformer",))
    specs = {"toy-arch": lambda: "the toy spec"}
    assert sources.arch_spec(specs, "toy-arch") == "the toy spec"
    with pytest.raises(
        KeyError, match=r"unknown Toy arch preset 'big-arch'; known: \['toy-arch'\]"
    ):
        sources.arch_spec(specs, "big-arch")

    def resolve(path: str) -> object:
        return sources.resolve(path, tiny=lambda: "tiny folder", arch=specs.__getitem__)

    (tmp_path / "model_index.json").write_text("{}")
    assert resolve("tiny") == "tiny folder"
    assert callable(resolve("toy-arch"))
    assert resolve(str(tmp_path)) == tmp_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE=1"):
        resolve("org/not-cached")


def test_family_tiny_preset_folder_names_the_family_in_folder_manifest_and_key(tmp_path) -> None:
    import json
    from dataclasses import dataclass

    from unirl.models.common.presets import family_tiny_preset_folder, tiny_preset_folder
    from unirl.models.common.tiny import corpus_lines

    @dataclass(frozen=True)
    class Spec:
        width: int = 3

    def write(folder) -> None:
        (folder / "model_index.json").write_text("{}")

    folder = family_tiny_preset_folder("toy", Spec(), builder=2, write=write, cache_dir=tmp_path)
    same = tiny_preset_folder(
        Spec(),
        preset="toy-tiny",
        folder_prefix="toy-tiny",
        builder=2,
        corpus=corpus_lines(),
        write=write,
        cache_dir=tmp_path,
        key_extra={"family": "toy"},
    )
    assert folder == same and folder.parent == tmp_path / "presets"
    assert folder.name.startswith("toy-tiny-")
    manifest = json.loads((folder / "unirl_preset.json").read_text())
    assert (manifest["preset"], manifest["builder"], manifest["spec"]) == (
        "toy-tiny",
        2,
        {"width": 3},
    )
    other = family_tiny_preset_folder("toy2", Spec(), builder=2, write=write, cache_dir=tmp_path)
    assert other.name.split("-")[-1] != folder.name.split("-")[-1]  # the family is in the key


# -- text_encode ---------------------------------------------------------------------------------


def test_user_turn_renders_one_user_turn_with_the_thinking_switch() -> None:
    from unirl.models.common.text_encode import module_device, module_dtype, user_turn
    from unirl.models.z_image.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(TinyZImageSpec())
    start, end = "<|im_start|>", "<|im_end|>"
    opened = f"{start}user\na cat{end}\n{start}assistant\n"
    assert user_turn(tokenizer, "a cat", enable_thinking=True) == opened
    assert (
        user_turn(tokenizer, "a cat", enable_thinking=False) == opened + "<think>\n\n</think>\n\n"
    )
    linear = torch.nn.Linear(2, 2).to(torch.float64)
    assert (module_device(linear), module_dtype(linear)) == (torch.device("cpu"), torch.float64)


# -- tiny_text -----------------------------------------------------------------------------------


def test_qwen3_chat_tokenizer_trains_on_the_turn_its_template_renders() -> None:
    from unirl.models.common.tiny_text import (
        QWEN3_CHAT_TEMPLATE,
        QWEN3_SPECIALS,
        qwen3_chat_tokenizer,
        qwen3_turn,
    )

    lines = ["a red fox", "a cat on a mat", "two dogs"]
    for thinking in (True, False):
        tokenizer = qwen3_chat_tokenizer(
            enable_thinking=thinking, vocab_size=300, model_max_length=64, lines=lines
        )
        assert [tokenizer.convert_tokens_to_ids(t) for t in QWEN3_SPECIALS] == [0, 1, 2, 3, 4]
        assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 2)
        assert tokenizer.model_max_length == 64
        assert tokenizer.chat_template == QWEN3_CHAT_TEMPLATE
        turn = qwen3_turn("a cat", enable_thinking=thinking)
        assert user_turn_of(tokenizer, "a cat", thinking) == turn
        assert turn.endswith("assistant\n" if thinking else "</think>\n\n")
        # the turn's specials are whole tokens
        assert tokenizer.convert_tokens_to_ids("<|im_start|>") in tokenizer(turn).input_ids


def test_qwen3_chat_tokenizer_refuses_a_template_that_renders_another_turn(monkeypatch) -> None:
    from unirl.models.common import tiny_text

    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    monkeypatch.setattr(tiny_text, "QWEN3_CHAT_TEMPLATE", plain)
    with pytest.raises(
        ValueError, match="the tiny chat template renders 'a red fox', not the turn"
    ):
        tiny_text.qwen3_chat_tokenizer(
            enable_thinking=True, vocab_size=300, model_max_length=64, lines=["a red fox"]
        )


def user_turn_of(tokenizer: object, text: str, thinking: bool) -> str:
    from unirl.models.common.text_encode import user_turn

    return user_turn(tokenizer, text, enable_thinking=thinking)


# -- geometry ------------------------------------------------------------------------------------


def test_latent_geometries_and_the_sigma_check() -> None:
    from unirl.models.common.geometry import (
        PackedLatentGeometry,
        VAELatentGeometry,
        sigma_per_sample,
    )

    vae = VAELatentGeometry()
    vae.latent_channels, vae.vae_scale_factor, vae.patch_size = 16, 8, 2
    assert vae.latent_shape(64, 128) == (16, 8, 16) and vae.image_seq_len(64, 128) == 32
    with pytest.raises(ValueError, match=r"multiples of 16 \(VAE factor 8 x 2x2 patches\)"):
        vae.latent_shape(72, 64)
    packed = PackedLatentGeometry()
    packed.vae_scale_factor, packed.packed_channels = 8, 64
    assert packed.latent_shape(64, 128) == (4, 8, 64) and packed.image_seq_len(64, 128) == 32
    with pytest.raises(ValueError, match=r"multiples of 16 \(VAE factor 8 x 2x2 packing\)"):
        packed.latent_shape(0, 64)
    packed.check_packing(16)
    with pytest.raises(ValueError, match="in_channels=64 is not 2x2 patches of the VAE's 8"):
        packed.check_packing(8)

    latents, rows = torch.zeros(3, 4), [0, 1, 2]
    cpu = torch.device("cpu")
    assert torch.equal(sigma_per_sample(0.5, latents, rows, device=cpu), torch.full((3,), 0.5))
    sigma = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    got = sigma_per_sample(sigma, latents, rows, device=cpu)
    assert got.dtype == torch.float32 and torch.equal(got, sigma.float())
    with pytest.raises(ValueError, match="3 latents but 2 condition rows"):
        sigma_per_sample(0.5, latents, rows[:2], device=cpu)
    with pytest.raises(ValueError, match="sigma has 2 values for 3 latents"):
        sigma_per_sample(torch.ones(2), latents, rows, device=cpu)


# -- tiny_causal_vae -----------------------------------------------------------------------------


@torch.no_grad()
def test_tiny_causal_decoder_shapes_time_upsamplers_only_for_video() -> None:
    from diffusers import AutoencoderKLQwenImage
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
        QwenImageAttentionBlock,
        QwenImageResample,
        QwenImageResidualBlock,
    )

    from unirl.models.common.tiny_causal_vae import CausalBlocks, TinyCausalDecoder
    from unirl.models.qwen_image.tiny import TinyQwenImageSpec, vae_config

    spec = TinyQwenImageSpec()
    blocks = CausalBlocks(QwenImageResidualBlock, QwenImageResample, QwenImageAttentionBlock)
    shaping = TinyCausalDecoder.from_spec(spec)
    assert (shaping.spec_name, shaping.decoder_signal_channels) == ("TinyQwenImageSpec", 6)

    def shaped(temporal: bool) -> AutoencoderKLQwenImage:
        torch.manual_seed(0)
        vae = AutoencoderKLQwenImage(**vae_config(spec))
        gen = torch.Generator().manual_seed(1)
        shaping.shape(vae, gen, blocks=blocks, temporal=temporal, centre_batch=(4, 1, 4, 4))
        return vae

    image, video = shaped(False), shaped(True)
    ups = [m for m in video.decoder.modules() if getattr(m, "mode", "") == "upsample3d"]
    assert ups, "the tiny decoder has temporal upsamplers"
    for m in ups:  # both new frames copy the current one: identity at t=2 in both halves
        w, dim, carried = m.time_conv.weight, m.dim, 8
        assert torch.equal(w[:carried, :carried, 2, 0, 0], torch.eye(carried))
        assert torch.equal(w[dim : dim + carried, :carried, 2, 0, 0], torch.eye(carried))
        assert int(w.count_nonzero()) == 2 * carried
    unshaped = [m for m in image.decoder.modules() if getattr(m, "mode", "") == "upsample3d"]
    assert all(int(m.time_conv.weight.count_nonzero()) > 2 * 8 for m in unshaped)
    # one latent frame decodes the same either way: time_conv only acts on later frames
    z = torch.randn(2, 16, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(image.decode(z).sample, video.decode(z).sample)
    bad = dataclasses.replace(shaping, decoder_anchor_channels=3)
    with pytest.raises(ValueError, match=r"^TinyQwenImageSpec: 6 signal \+ 3 anchor channels"):
        bad.shape(
            shaped(False),
            torch.Generator(),
            blocks=blocks,
            temporal=False,
            centre_batch=(1, 1, 2, 2),
        )


# -- progress (Hugging Face noise) ---------------------------------------------------------------


def test_hf_warnings_off_restores_both_loggers_and_the_tiny_build_is_quiet() -> None:
    """Inside the block transformers' and diffusers' loggers are at error, after it back where
    they were; a new user's first run (a fresh process building the tiny SD3) prints no
    torchvision warning for the SD3 pipeline's unused image processors."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    from unirl.models.common.progress import hf_warnings_off

    before = (transformers_logging.get_verbosity(), diffusers_logging.get_verbosity())
    with hf_warnings_off():
        assert transformers_logging.get_verbosity() == transformers_logging.ERROR
        assert diffusers_logging.get_verbosity() == diffusers_logging.ERROR
    assert (transformers_logging.get_verbosity(), diffusers_logging.get_verbosity()) == before

    repo = str(Path(__file__).resolve().parents[2])
    code = (
        "from unirl.models.sd3.tiny import TinySD3Spec, build_tiny_pipeline\n"
        "build_tiny_pipeline(TinySD3Spec())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": repo},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torchvision" not in done.stderr, done.stderr
