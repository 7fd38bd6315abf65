"""The tiny SD3 stack is a real diffusers model and a usable RL testbed: diffusers loads and
runs it, decoded pixels respond strongly and smoothly to the latents (the random-VAE trap),
and LoRA on the transformer receives a training signal."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL, StableDiffusion3Pipeline

from unirl.models.sd3 import TinySD3Spec
from unirl.models.sd3.tiny import vae_config


def test_diffusers_pipeline_loads_tiny_folder_and_generates(tiny_sd3_path):
    pipe = StableDiffusion3Pipeline.from_pretrained(tiny_sd3_path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        ["a red fox, oil painting", 'a neon sign that says "OPEN"'],
        num_inference_steps=2,
        height=64,
        width=64,
        guidance_scale=4.5,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    )
    images = out.images
    assert images.shape == (2, 3, 64, 64)
    assert torch.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
    assert (images[0] - images[1]).abs().mean() > 0.05, "two prompts / noises gave the same image"


def test_tiny_stack_size(tiny_sd3_bundle):
    counts = {
        name: sum(p.numel() for p in getattr(tiny_sd3_bundle, name).parameters())
        for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")
    }
    total = sum(counts.values())
    assert 0.5e6 <= total <= 2e6, counts
    assert counts["transformer"] <= 0.5e6, counts


def _decode(bundle, latents):
    with torch.no_grad():
        return bundle.decode(latents)


def _brightness_direction(decode_fn, latents):
    """Unit 16-vector: the per-channel latent shift that raises mean brightness fastest."""
    shift = torch.zeros(latents.shape[1], requires_grad=True)
    with torch.enable_grad():
        decode_fn(latents + shift.view(1, -1, 1, 1)).mean().backward()
    return shift.grad / shift.grad.norm()


def _sweep(decode_fn, latents, direction):
    ts = torch.linspace(-2.0, 2.0, 9)
    with torch.no_grad():
        return torch.stack(
            [decode_fn(latents + t * direction.view(1, -1, 1, 1)).mean() for t in ts]
        )


def test_vae_decoder_responds_strongly_and_smoothly_to_latents(tiny_sd3_bundle):
    """The trap: a random decoder barely reacts to latents, so pixel rewards cannot be learned."""
    bundle = tiny_sd3_bundle
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(32, *bundle.latent_shape(64, 64), generator=gen)
    pixels = _decode(bundle, latents)

    # Different latents give visibly different images that use most of the pixel range.
    assert pixels.std(dim=0).mean() > 0.15
    lo, hi = pixels.flatten().quantile(torch.tensor([0.05, 0.95])).tolist()
    assert hi - lo > 0.6, (lo, hi)
    assert (pixels[:16] - pixels[16:]).abs().mean() > 0.15
    assert abs(pixels.mean().item() - 0.5) < 0.1, "decoder should be centred on mid-grey"

    # Brightness is a smooth, monotone, strong function of a latent direction.
    direction = _brightness_direction(bundle.decode, latents[:8])
    a = torch.randn(32, generator=gen)
    brightness = _decode(bundle, latents + a.view(-1, 1, 1, 1) * direction.view(1, -1, 1, 1)).mean(
        dim=(1, 2, 3)
    )
    corr = torch.corrcoef(torch.stack([a, brightness]))[0, 1]
    assert corr > 0.9, corr
    sweep = _sweep(bundle.decode, latents[:4], direction)
    assert (sweep.diff() > 0).all(), sweep
    assert sweep[-1] - sweep[0] > 0.4, sweep

    # Colour responds too: each RGB channel's mean moves along its own latent direction.
    for c in range(3):
        shift = torch.zeros(latents.shape[1], requires_grad=True)
        with torch.enable_grad():
            bundle.decode(latents[:4] + shift.view(1, -1, 1, 1))[:, c].mean().backward()
        d = shift.grad / shift.grad.norm()
        with torch.no_grad():
            moved = (
                bundle.decode(latents[:4] + 2 * d.view(1, -1, 1, 1))[:, c].mean()
                - pixels[:4, c].mean()
            )
        assert moved > 0.15, (c, moved)


def test_shaped_decoder_beats_an_unshaped_random_decoder(tiny_sd3_bundle):
    """Documents why the preset shapes its decoder: the same VAE at plain random init
    moves brightness far less along its own best direction."""
    spec = TinySD3Spec()
    torch.manual_seed(1)
    raw = AutoencoderKL(**vae_config(spec)).eval()

    def raw_decode(latents):
        z = latents / spec.scaling_factor + spec.shift_factor
        return (raw.decode(z).sample / 2 + 0.5).clamp(0, 1)

    latents = torch.randn(
        8, *tiny_sd3_bundle.latent_shape(64, 64), generator=torch.Generator().manual_seed(3)
    )
    shaped = _sweep(
        tiny_sd3_bundle.decode, latents, _brightness_direction(tiny_sd3_bundle.decode, latents)
    )
    unshaped = _sweep(raw_decode, latents, _brightness_direction(raw_decode, latents))
    assert (shaped[-1] - shaped[0]) > 2 * (unshaped[-1] - unshaped[0]), (shaped, unshaped)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_transformer_velocity_is_not_degenerate(tiny_sd3_bundle):
    bundle = tiny_sd3_bundle
    cond = bundle.encode_prompts(["a red fox", 'a neon sign that says "OPEN"'], negative=True)
    x = torch.randn(
        1, *bundle.latent_shape(64, 64), generator=torch.Generator().manual_seed(0)
    ).expand(2, -1, -1, -1)
    with torch.no_grad():
        v = bundle.predict_velocity(x, 0.7, cond)
        v_neg = bundle.predict_velocity(x, 0.7, cond.negative())
        v_late = bundle.predict_velocity(x, 0.3, cond)
    assert v.std() > 0.1
    assert _rel(v[0], v[1]) > 0.01, "velocity ignores the prompt"
    assert _rel(v_neg, v) > 0.01, "CFG would have nothing to amplify"
    assert _rel(v_late, v) > 0.01, "velocity ignores sigma"


def test_lora_on_default_targets_gets_nonzero_gradients(make_tiny_sd3):
    from peft import LoraConfig, inject_adapter_in_model

    bundle = make_tiny_sd3()
    targets = list(bundle.lora_default_targets)
    inject_adapter_in_model(
        LoraConfig(r=4, lora_alpha=8, target_modules=targets), bundle.transformer
    )
    for name, p in bundle.transformer.named_parameters():
        p.requires_grad_("lora_" in name)
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=False)
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, *bundle.latent_shape(64, 64), generator=gen)
    v = bundle.predict_velocity(latents, torch.tensor([0.8, 0.4]), cond)
    (v * torch.randn(v.shape, generator=gen)).sum().backward()

    last = len(bundle.transformer.transformer_blocks) - 1
    lora_b = {n: p for n, p in bundle.transformer.named_parameters() if "lora_B" in n}
    lora_a = {n: p for n, p in bundle.transformer.named_parameters() if "lora_A" in n}
    assert lora_b and len(lora_a) == len(lora_b)
    covered = {t for t in targets if any(f".{t}.lora_B" in n for n in lora_b)}
    assert covered == set(targets), covered
    for name, p in lora_b.items():
        # The last block is context_pre_only: its text-query projection cannot reach the output.
        if name.startswith(f"transformer_blocks.{last}.attn.add_q_proj"):
            assert p.grad is None or p.grad.abs().max() == 0
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.norm() > 1e-4, (name, p.grad.norm())
    # B is zero-initialised, so A's gradient is exactly zero until B moves.
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in lora_a.values())
