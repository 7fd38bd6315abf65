"""ZImageBundle against diffusers' own ZImagePipeline pieces on the tiny preset: prompt
encoding, the σ policy, Z-Image's CFG with its normalisation and truncation knobs (sampling
with them equals the pipeline's), the velocity call and decode; the tiny decoder responds to
latents; SGLang's condition map; config, checks and plumbing. (The shared contract — ODE
sampling, ratio 1, replay, LoRA export, arch — is ``test_family_z_image.py``.)"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from bundle_contract import BundleContract
from family_tester import run_diffusers

from unirl.config import ConfigError
from unirl.models.common.engine_maps import engine_maps_for
from unirl.models.z_image import (
    ZImageBundle,
    ZImageBundleConfig,
    ZImageCFG,
    ZImageConditions,
    ZImagePipeline,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.models.z_image.tiny import SCHEDULER_CONFIG
from unirl.sde import ODE, FlowSDE, sigmas_from_scheduler_config
from unirl.types import DiffusionRequest, DiffusionSamplingParams, Packed, RolloutReq, Texts

PROMPTS = ["a red fox, oil painting", 'a neon sign that says "OPEN"', ""]
TEXT_TOKENS = 64


@pytest.fixture(scope="module")
def bundle() -> ZImageBundle:
    return make_bundle()


def make_bundle(**overrides: object) -> ZImageBundle:
    kwargs: dict[str, object] = {
        "path": "tiny",
        "dtype": "fp32",
        "text_encoder_dtype": "fp32",
        "device": "cpu",
        "max_sequence_length": TEXT_TOKENS,
    }
    return ZImageBundle(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def reference():
    from diffusers import ZImagePipeline as DiffusersZImagePipeline

    from unirl.models.common.progress import hf_progress_bars_disabled

    with hf_progress_bars_disabled():
        pipe = DiffusersZImagePipeline.from_pretrained(tiny_preset_path(), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def request(
    bundle: ZImageBundle,
    prompts: list[str],
    *,
    steps: int,
    guidance_scale: float,
    sde_indices: list[list[int]],
    size: int = 64,
) -> RolloutReq:
    n = len(prompts)
    return RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n),
        primitives={"text": Texts(texts=list(prompts))},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor(sde_indices, dtype=torch.long).reshape(n, -1),
                sigmas=bundle.sigmas(steps, size, size),
                init_noise_shape=tuple(bundle.latent_shape(size, size)),
            )
        },
        sampling_params=DiffusionSamplingParams(
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            height=size,
            width=size,
            samples_per_prompt=1,
            negative_prompt="",
        ),
        seed=3,
    )


# -- encoding ----------------------------------------------------------------------------------


@torch.no_grad()
def test_encode_prompts_equals_diffusers_encode_prompt(bundle, reference) -> None:
    cond = bundle.encode_prompts(PROMPTS, negative=True, negative_prompt=" ")
    # encode_prompt rewrites the prompt list it is given (the chat template): pass a copy
    theirs_pos, theirs_neg = reference.encode_prompt(
        list(PROMPTS), negative_prompt=[" "] * 3, max_sequence_length=TEXT_TOKENS
    )
    assert isinstance(cond, ZImageConditions) and len(cond) == 3
    # one variable-length caption per prompt, bit for bit, chat-template tokens included
    for mine, theirs in zip(cond.captions(), theirs_pos, strict=True):
        assert torch.equal(mine, theirs)
    for mine, theirs in zip(cond.negative().captions(), theirs_neg, strict=True):
        assert torch.equal(mine, theirs)
    lengths = cond.prompt_embeds.lengths.tolist()
    assert lengths[2] < lengths[0] < lengths[1] <= TEXT_TOKENS  # "" still has its template
    assert cond.prompt_embeds.offsets.device.type == "cpu"  # splitting reads no device value
    capped = make_bundle(max_sequence_length=12).encode_prompts(PROMPTS[1:2])
    assert capped.prompt_embeds.lengths.tolist() == [12]


@torch.no_grad()
def test_groups_share_one_encoding_and_the_negative_is_cached(bundle) -> None:
    cond = bundle.encode_prompts(["a cat", "a dog", "a cat"], negative=True, samples_per_prompt=2)
    rows = cond.captions()
    assert len(cond) == 6 and torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[4])
    assert not torch.equal(rows[0], rows[2])
    assert bundle.negative_conditions() is bundle.negative_conditions()
    negs = cond.negative().captions()
    assert all(torch.equal(negs[0], row) for row in negs)
    with pytest.raises(TypeError, match="list of texts"):
        bundle.encode_prompts("a cat")


def test_captions_of_different_lengths_concatenate_and_select(bundle) -> None:
    a = bundle.encode_prompts(["a cat"], negative=True)
    b = bundle.encode_prompts(["a very small cat sitting on a big red chair"], negative=True)
    both = ZImageConditions.concat([a, b])
    assert [c.shape[0] for c in both.captions()] == [
        a.captions()[0].shape[0],
        b.captions()[0].shape[0],
    ]
    assert torch.equal(both.select([1]).captions()[0], b.captions()[0])
    assert torch.equal(both.repeat_interleave(2).captions()[3], b.captions()[0])
    with pytest.raises(ValueError, match="negative"):
        a.positive().negative()
    with pytest.raises(ValueError, match="rows and width"):
        ZImageConditions(
            prompt_embeds=a.prompt_embeds,
            negative_prompt_embeds=Packed.from_list([torch.zeros(3, 8)]),
        )
    with pytest.raises(ValueError, match="Packed captions"):
        ZImageConditions(prompt_embeds=torch.zeros(1, 3, 32))  # type: ignore[arg-type]


# -- σ policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shift", [3.0, 6.0])
@pytest.mark.parametrize("steps", [2, 8, 9, 10, 28, 50])
def test_sigmas_equal_the_pipelines(shift, steps) -> None:
    """The pipeline hands its scheduler ``torch.linspace(1, 1/T, T)`` in float32; the
    float64 ``linspace`` of the other families differs in the last bit for most T."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

    config = {**SCHEDULER_CONFIG, "shift": shift}
    scheduler = FlowMatchEulerDiscreteScheduler(**config)
    scheduler.set_timesteps(steps, sigmas=get_default_z_image_sigmas(steps), mu=0.5)
    ours = sigmas_from_scheduler_config({**config, "sigma_spacing": "linspace_fp32"}, steps)
    assert torch.equal(ours, scheduler.sigmas)
    if steps == 10:
        float64 = sigmas_from_scheduler_config({**config, "sigma_spacing": "linspace"}, steps)
        assert not torch.equal(float64, scheduler.sigmas)


def test_bundle_sigmas_use_the_static_shift(bundle) -> None:
    assert bundle.scheduler_config["sigma_spacing"] == "linspace_fp32"
    assert bundle.image_seq_len(64, 64) == 16 and bundle.image_seq_len(1024, 512) == 2048
    small, large = bundle.sigmas(10, 64, 64), bundle.sigmas(10, 1024, 1024)
    assert torch.equal(small, large), "a static shift does not depend on the resolution"
    assert small[0] == 1.0 and small[-1] == 0.0 and bool((small[1:-1] > 0.3).all())


# -- guidance ----------------------------------------------------------------------------------


class _Linear:
    """A family whose conditional / negative velocities are ``latents * conditions``."""

    def predict_velocity(self, latents, sigma, conditions):
        return latents * conditions


def _pipeline_cfg(pos: torch.Tensor, neg: torch.Tensor, g: float, k: float) -> torch.Tensor:
    """The pipeline's per-sample loop in float64: ``pos + g·(pos − neg)``, norm capped."""
    out = []
    for p, n in zip(pos.double(), neg.double(), strict=True):
        pred = p + g * (p - n)
        if k > 0 and pred.norm() > k * p.norm():
            pred = pred * (k * p.norm() / pred.norm())
        out.append(pred)
    return torch.stack(out)


@pytest.mark.parametrize("k", [0.0, 0.5, 1.0, 5.0])
def test_cfg_is_the_pipelines_formula_with_the_norm_cap(k) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 2, 2, generator=gen)
    cond, uncond = torch.randn(3, 4, 2, 2, generator=gen), torch.randn(3, 4, 2, 2, generator=gen)
    guidance = ZImageCFG(normalization=k)
    v_c, v_u = x * cond, x * uncond
    v = guidance.combine(v_c, v_u, 4.0)
    # our velocities are the negated outputs: the pipeline's pred on -v gives -v
    torch.testing.assert_close(v.double(), -_pipeline_cfg(-v_c, -v_u, 3.0, k), rtol=1e-6, atol=1e-6)
    if k > 0:
        cap = k * v_c.flatten(1).norm(dim=1)
        assert bool((v.flatten(1).norm(dim=1) <= cap * (1 + 1e-6)).all())
    plain = guidance.velocity(_Linear(), x, torch.full((3,), 0.5), cond, 1.0)
    assert torch.equal(plain, v_c)


def test_truncation_turns_guidance_off_where_one_minus_sigma_exceeds_it() -> None:
    guidance = ZImageCFG(truncation=0.5)
    rows = guidance.guided_rows(torch.tensor([0.9, 0.5, 0.2]))
    assert rows is not None and rows.tolist() == [True, True, False]  # 1-σ <= 0.5 is guided
    assert ZImageCFG().guided_rows(torch.tensor([0.1])) is None  # τ = 1: nothing read

    class Conds:
        def __init__(self, value: torch.Tensor) -> None:
            self.value = value

    class Family:
        def predict_velocity(self, latents, sigma, conditions):
            return latents * conditions.value

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 2, 2, generator=gen)
    cond = Conds(torch.randn(2, 4, 2, 2, generator=gen))
    uncond = Conds(torch.randn(2, 4, 2, 2, generator=gen))
    from unirl.models.z_image.guidance import CFGInputs

    both = Conds(torch.cat([cond.value, uncond.value]))
    fwd = CFGInputs(cond=cond, uncond=uncond, both=both)  # type: ignore[arg-type]
    recorded: list[torch.Tensor] = []
    late = guidance.velocity(Family(), x, torch.tensor([0.2, 0.2]), fwd, 4.0, uncond_out=recorded)
    assert torch.equal(late, x * cond.value) and float(recorded[0].abs().max()) == 0.0
    # rows at different steps (a replayed micro-batch): the truncated row is v_c exactly,
    # whatever the (reused) unconditional velocity holds
    nan_uncond = torch.full_like(x, float("nan"))
    mixed = guidance.velocity(Family(), x, torch.tensor([0.9, 0.2]), fwd, 4.0, v_uncond=nan_uncond)
    assert torch.equal(mixed[1], (x * cond.value)[1]) and bool(mixed[0].isnan().all())
    full = guidance.velocity(Family(), x, torch.tensor([0.9, 0.2]), fwd, 4.0)
    expected = guidance.combine(x * cond.value, x * uncond.value, 4.0)
    assert torch.equal(full[0], expected[0]) and torch.equal(full[1], (x * cond.value)[1])


def test_bundle_guidance_carries_the_configs_knobs() -> None:
    tuned = make_bundle(cfg_normalization=1.0, cfg_truncation=0.6)
    assert tuned.guidance == ZImageCFG(normalization=1.0, truncation=0.6)
    assert ZImagePipeline(bundle=tuned, strategy=ODE()).guidance is tuned.guidance


@pytest.mark.parametrize(
    "normalization, truncation, guided_steps", [(1.0, 1.0, 6), (0.0, 0.1, 3), (0.7, 0.2, 4)]
)
def test_ode_sampling_with_the_knobs_equals_diffusers(
    reference, normalization, truncation, guided_steps
) -> None:
    """Sampling with ``cfg_normalization`` / ``cfg_truncation`` set equals the pipeline's
    (latents and pixels bit for bit; with truncation the late steps run unguided)."""
    bundle = make_bundle(cfg_normalization=normalization, cfg_truncation=truncation)
    steps = 6
    req = request(bundle, PROMPTS[:2], steps=steps, guidance_scale=4.0, sde_indices=[[], []])
    sigmas = req.params_for("diffusion", DiffusionRequest).sigmas[:-1]
    # σ = 1, .968, .923, .857, .75, .545: the late steps run unguided where 1 - σ > τ
    guided = [bundle.guidance.guided_rows(s.reshape(1)) for s in sigmas]
    assert sum(g is None or bool(g[0]) for g in guided) == guided_steps
    track = ZImagePipeline(bundle=bundle, strategy=ODE()).generate(req).tracks["diffusion"]
    latents, pixels = run_diffusers(
        reference,
        prompts=list(PROMPTS[:2]),
        negative_prompt="",
        guidance_scale=3.0,
        cfg_normalization=normalization,
        cfg_truncation=truncation,
        num_inference_steps=steps,
        height=64,
        width=64,
        latents=req.params_for("diffusion", DiffusionRequest).initial_noise(req.seed),
        max_sequence_length=TEXT_TOKENS,
    )
    assert torch.equal(track.segment.final_latents, latents)
    assert torch.equal(track.decoded.pixels, pixels)


def test_replay_across_truncated_and_guided_steps() -> None:
    """Rows whose trained step is guided or truncated share a replayed batch: the guided row
    replays bit for bit, the truncated one (v_c now from the batched forward) within fp32
    rounding; a reused (recorded) unconditional velocity changes nothing."""
    bundle = make_bundle(cfg_truncation=0.1)
    steps = 6
    sigmas = bundle.sigmas(steps, 64, 64)
    guided_step, truncated_step = 0, 5
    assert 1 - float(sigmas[guided_step]) <= 0.1 < 1 - float(sigmas[truncated_step])
    pipeline = ZImagePipeline(bundle=bundle, strategy=FlowSDE(eta=0.7), record_uncond=True)
    req = request(
        bundle,
        PROMPTS[:2],
        steps=steps,
        guidance_scale=4.0,
        sde_indices=[[guided_step], [truncated_step]],
    )
    track = pipeline.generate(req).tracks["diffusion"]
    segment = track.segment
    assert float(segment.sde_uncond[1].abs().max()) == 0.0  # truncated: no v_u, recorded as 0
    with torch.no_grad():
        replayed = pipeline.replay(track.conditions, segment, 0)
        reused = pipeline.replay(
            track.conditions, segment, 0, cfg_gradient="cond_only", reuse_uncond=True
        )
    assert torch.equal(replayed.log_prob[0], segment.sde_logp[0, 0])
    gap = (replayed.log_prob - segment.sde_logp[:, 0]).abs().max()
    assert float(gap) <= 1e-6
    assert float((reused.log_prob - segment.sde_logp[:, 0]).abs().max()) <= 1e-6


# -- velocity and decode -----------------------------------------------------------------------


@torch.no_grad()
def test_velocity_and_decode_match_the_pipelines_calls(bundle, reference) -> None:
    cond = bundle.encode_prompts(PROMPTS[:2])
    latents = torch.randn(
        2, *bundle.latent_shape(64, 128), generator=torch.Generator().manual_seed(0)
    )
    assert latents.shape == (2, 16, 8, 16)
    sigma = torch.tensor([0.75, 0.25])
    v = bundle.predict_velocity(latents, sigma, cond)
    out = reference.transformer(
        list(latents.unsqueeze(2).unbind(0)),
        (1000 - sigma * 1000) / 1000,  # the pipeline's t: 1 at data
        cond.captions(),
        return_dict=False,
    )[0]
    assert v.dtype == torch.float32 and torch.equal(v, -torch.stack(out).squeeze(2))
    # a condition batch with negatives (what DiffusionNFT hands over) uses the prompt rows
    paired = bundle.encode_prompts(PROMPTS[:2], negative=True)
    assert torch.equal(bundle.predict_velocity(latents, sigma, paired), v)
    pixels = bundle.decode(latents)
    vae = reference.vae
    image = vae.decode(
        latents / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False
    )[0]
    expected = reference.image_processor.postprocess(image, output_type="pt")
    assert pixels.shape == (2, 3, 64, 128) and torch.equal(pixels, expected)


def test_tiny_stack_size(bundle) -> None:
    counts = {
        name: sum(p.numel() for p in getattr(bundle, name).parameters())
        for name in ("transformer", "vae", "text_encoder")
    }
    assert 0.7e6 <= sum(counts.values()) <= 1.5e6 and counts["transformer"] <= 0.7e6, counts


# -- config, checks, plumbing ------------------------------------------------------------------


def test_config_names_bad_fields() -> None:
    for kwargs, field in [
        ({"cfg_normalization": -1.0}, "bundle.cfg_normalization"),
        ({"cfg_truncation": 1.5}, "bundle.cfg_truncation"),
        ({"max_sequence_length": 0}, "bundle.max_sequence_length"),
        ({"dtype": "fp8"}, "bundle.dtype"),
        ({"path": ""}, "bundle.path"),
    ]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            ZImageBundleConfig(**kwargs)
    # the caption axis of the tiny model's RoPE table holds 1536 positions
    with pytest.raises(ConfigError, match=r"bundle\.max_sequence_length=1600 .*axes_lens\[0\]"):
        make_bundle(max_sequence_length=1600)


def test_check_config_takes_the_released_sizes_within_the_rope_table() -> None:
    ZImageBundle.check_config(
        {"path": "z-image-arch"}, type("R", (), {"sampling": {"height": 1024, "width": 1536}})()
    )
    huge = type("R", (), {"sampling": {"height": 512, "width": 16 * 513}})()
    with pytest.raises(ConfigError, match=r"axes_lens\[2\]=512"):
        ZImageBundle.check_config({"path": "z-image-arch"}, huge)
    # the feed-forward projections exist too (LoRA may target them)
    module = ZImageBundle.trainable_on_meta({"path": "tiny"})
    from unirl.train.lora import validate_targets

    validate_targets(module, [*ZImageBundle.lora_default_targets, "w1", "w2", "w3"], where="t")


class TestZImageBundleContract(BundleContract):
    bundle_class = ZImageBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": 16, "cfg_truncation": 0.9}
    family_label = "Z-Image"
    arch_preset = "z-image-arch"
    resolve_model_source = staticmethod(resolve_model_source)
    decoder_channel_dim = 0  # the VAE latent [C, h, w]

    def check_built(self, built: ZImageBundle) -> None:
        assert built.guidance == ZImageCFG(truncation=0.9)
        assert built.block_class_names == ("ZImageTransformerBlock",)


# -- external engines --------------------------------------------------------------------------


@torch.no_grad()
def test_sglang_denoising_env_maps_to_our_conditions(bundle) -> None:
    """SGLang records each sample's caption as ``encoder_hidden_states`` (a tensor or a
    one-element list, of its own length); the map packs them as ``encode_prompts`` does."""
    ours = bundle.encode_prompts(PROMPTS[:2], negative=True)
    envs = [
        {
            "pos_cond_kwargs": {"encoder_hidden_states": [pos[None]], "freqs_cis": (None, None)},
            "neg_cond_kwargs": {"encoder_hidden_states": neg},
        }
        for pos, neg in zip(ours.captions(), ours.negative().captions(), strict=True)
    ]
    maps = engine_maps_for(ZImageBundle, "sglang")
    mapped = maps.sglang_conditions(envs)
    for a, b in zip(mapped.captions(), ours.captions(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(mapped.negative().captions(), ours.negative().captions(), strict=True):
        assert torch.equal(a, b)
    no_cfg = maps.sglang_conditions([{"pos_cond_kwargs": e["pos_cond_kwargs"]} for e in envs])
    assert not no_cfg.has_negative
    with pytest.raises(ValueError, match="rollout_return_denoising_env"):
        maps.sglang_conditions([{"pos_cond_kwargs": {"freqs_cis": None}}])
    frames = torch.randn(3, 2, 16, 1, 8, 8)  # [N, steps, C, 1, h, w]
    assert torch.equal(maps.from_engine_latents(frames, (16, 8, 8)), frames.squeeze(-3))
    assert maps.sglang_guidance(4.0) == {"guidance_scale": 4.0}
    with pytest.raises(ConfigError, match="vllm_omni engine has no mapper"):
        engine_maps_for("unirl.models.z_image.ZImageBundle", "vllm_omni")


def test_split_uneven_runs_unmasked_forwards_equal_to_the_masked_batch() -> None:
    """``cfg_split_uneven``: a prompt and a negative prompt whose captions pad to different
    lengths run as two forwards, neither with an attention mask, and give the masked batch's
    velocity up to float rounding (measured: 7.7e-7 of its largest value in fp32; the
    gradient 1.2e-6). Captions
    of one padded length keep the one batched forward."""
    batched, split = make_bundle(), make_bundle(cfg_split_uneven=True)
    split.transformer.load_state_dict(batched.transformer.state_dict())
    assert split.guidance == ZImageCFG(split_uneven=True)
    long_prompt = "a very small cat sitting on a big red chair in a sunny kitchen " * 3
    for b in (batched, split):
        b.transformer.requires_grad_(True)

    def run(b: ZImageBundle, prompt: str) -> tuple[torch.Tensor, list[bool], torch.Tensor]:
        masks: list[bool] = []
        hooks = [
            layer.register_forward_pre_hook(
                lambda _m, args, kwargs: masks.append(
                    (args[1] if len(args) > 1 else kwargs.get("attn_mask")) is not None
                ),
                with_kwargs=True,
            )
            for layer in b.transformer.layers
        ]
        cond = b.encode_prompts([prompt], negative=True, samples_per_prompt=2)
        torch.manual_seed(0)
        x = torch.randn(2, *b.latent_shape(64, 64))
        fwd = b.guidance.forward_conditions(b, cond, 4.0)
        v = b.guidance.velocity(b, x, torch.tensor([0.7, 0.7]), fwd, 4.0)
        for hook in hooks:
            hook.remove()
        weight = b.transformer.layers[0].attention.to_q.weight
        (grad,) = torch.autograd.grad(v.square().sum(), [weight])
        return v.detach(), masks, grad

    padded = split.encode_prompts([long_prompt], negative=True).padded_lengths()
    negative = split.negative_conditions().padded_lengths()
    assert int(padded[0]) > int(negative[0])  # the case: one batch would need the mask
    v_batched, masks_batched, g_batched = run(batched, long_prompt)
    v_split, masks_split, g_split = run(split, long_prompt)
    assert any(masks_batched) and not any(masks_split)
    assert len(masks_split) == 2 * len(masks_batched)  # two forwards instead of one
    scale = v_batched.abs().max()
    assert torch.allclose(v_split, v_batched, rtol=0, atol=1e-5 * float(scale))
    assert torch.allclose(g_split, g_batched, rtol=0, atol=1e-5 * float(g_batched.abs().max()))

    short = "a cat"
    assert int(split.encode_prompts([short], negative=True).padded_lengths()[0]) == int(negative[0])
    v_one, masks_one, _ = run(split, short)
    v_ref, masks_ref, _ = run(batched, short)
    assert len(masks_one) == len(masks_ref) and not any(masks_one)  # one batched forward
    assert torch.equal(v_one, v_ref)


def test_recompile_hint_names_the_split_knob_until_it_is_on() -> None:
    assert "bundle.cfg_split_uneven=true" in (make_bundle().recompile_hint() or "")
    assert make_bundle(cfg_split_uneven=True).recompile_hint() is None
