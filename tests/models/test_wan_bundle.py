"""WanBundle against diffusers' own Wan pipeline pieces on the tiny presets: prompt encoding,
the σ policy, video geometry, the tiny decoder, Wan 2.2's experts (routing at the boundary,
which train, the frozen one refusing a trained step), image-to-video against
``WanImageToVideoPipeline``, and the config checks. (The shared contract — ODE sampling, ratio
1, replay, LoRA export, arch — is ``test_family_wan.py``.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from unirl.config import ConfigError
from unirl.models.common.presets import ModelSourceError
from unirl.models.wan import (
    WanBundle,
    WanConditions,
    WanExperts,
    WanPipeline,
    split_expert_lora,
    tiny_preset_path,
)
from unirl.models.wan.presets import scheduler_config_of
from unirl.sde import ODE, FlowSDE, sigmas_from_scheduler_config
from unirl.types import (
    DiffusionRequest,
    DiffusionSamplingParams,
    Images,
    RolloutReq,
    Texts,
)

PROMPTS = ["a red fox, oil painting", "a neon  sign &amp; a cafe", ""]
TEXT_TOKENS = 32
H, W, FRAMES = 32, 48, 5


def make(path: str = "tiny", **overrides: object) -> WanBundle:
    kwargs: dict = {
        "path": path,
        "dtype": "fp32",
        "text_encoder_dtype": "fp32",
        "device": "cpu",
        "max_sequence_length": TEXT_TOKENS,
    }
    return WanBundle(**{**kwargs, **overrides})


def load_reference(preset: str):
    from diffusers import WanImageToVideoPipeline
    from diffusers import WanPipeline as DiffusersWanPipeline

    from unirl.models.common.progress import hf_progress_bars_disabled

    cls = WanImageToVideoPipeline if preset == "tiny-i2v" else DiffusersWanPipeline
    with hf_progress_bars_disabled():
        pipe = cls.from_pretrained(tiny_preset_path(preset), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def bundle() -> WanBundle:
    return make()


@pytest.fixture(scope="module")
def reference():
    return load_reference("tiny")


@pytest.fixture(scope="module")
def experts() -> WanBundle:
    return make("tiny-wan2.2")


def video_request(bundle: WanBundle, prompts: list[str], *, steps: int, sde: tuple[int, ...] = (), images: torch.Tensor | None = None, guidance: float = 4.0) -> RolloutReq:  # fmt: skip
    n = len(prompts)
    params = DiffusionSamplingParams(
        num_inference_steps=steps,
        guidance_scale=guidance,
        height=H,
        width=W,
        num_frames=FRAMES,
        samples_per_prompt=1,
        negative_prompt="",
    )
    primitives: dict = {"text": Texts(texts=prompts)}
    if images is not None:
        primitives["image"] = Images(pixels=images)
    return RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n),
        primitives=primitives,
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor([list(sde)] * n, dtype=torch.long).reshape(n, -1),
                sigmas=bundle.sigmas(steps, H, W),
                init_noise_shape=bundle.latent_shape_for(params),
            )
        },
        sampling_params=params,
        seed=3,
    )


# -- encoding and the σ policy ---------------------------------------------------------------------


@torch.no_grad()
def test_encode_prompts_equals_diffusers_encode_prompt(bundle, reference) -> None:
    cond = bundle.encode_prompts(PROMPTS, negative=True, negative_prompt="blurry")
    embeds, negative = reference.encode_prompt(
        PROMPTS, negative_prompt=["blurry"] * 3, max_sequence_length=TEXT_TOKENS
    )
    assert isinstance(cond, WanConditions) and cond.prompt_embeds.shape == (3, TEXT_TOKENS, 32)
    assert torch.equal(cond.prompt_embeds, embeds)  # cleaning, padding, zeroed tail: bit for bit
    assert torch.equal(cond.negative_prompt_embeds, negative)
    # positions past a prompt's tokens are exactly zero; the empty prompt keeps only </s>
    assert bool((cond.prompt_embeds[2, 1:] == 0).all()) and bool(cond.prompt_embeds[2, 0].any())
    pairs = bundle.cfg_conditions(cond)
    assert torch.equal(pairs.prompt_embeds, torch.cat([negative, embeds]))


def test_groups_share_one_encoding_and_the_negative_is_cached(bundle) -> None:
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=True, samples_per_prompt=2)
    assert len(cond) == 4 and torch.equal(cond.prompt_embeds[0], cond.prompt_embeds[1])
    other = bundle.encode_prompts(["a bird"], negative=True)
    assert cond.negative_prompt_embeds.data_ptr() == other.negative_prompt_embeds.data_ptr()


def test_sigma_policy_is_the_static_flow_shift(bundle, reference) -> None:
    reference.scheduler.set_timesteps(6)
    assert torch.equal(bundle.sigmas(6, H, W), reference.scheduler.sigmas.float())
    assert bundle.scheduler_config["shift"] == 3.0
    # the released checkpoints' UniPC config keeps its flow_shift; the bundle field overrides it
    unipc = {"_class_name": "UniPCMultistepScheduler", "flow_shift": 5.0, "use_flow_sigmas": True}
    assert scheduler_config_of(unipc) == {"num_train_timesteps": 1000, "shift": 5.0}
    shifted = make(flow_shift=5.0)
    assert torch.equal(
        shifted.sigmas(6, H, W),
        sigmas_from_scheduler_config({"num_train_timesteps": 1000, "shift": 5.0}, 6),
    )


def test_video_geometry_and_its_refusals(bundle) -> None:
    params = DiffusionSamplingParams(height=H, width=W, num_frames=FRAMES)
    assert bundle.latent_shape_for(params) == (16, 2, 4, 6)
    assert bundle.latent_shape_for(DiffusionSamplingParams(height=H, width=W, num_frames=81)) == (
        16,
        21,
        4,
        6,
    )
    assert bundle.latent_shape(H, W) == (16, 1, 4, 6)  # one frame
    with pytest.raises(ConfigError, match=r"num_frames=6 must be 4·k \+ 1.*use 5 or 9"):
        bundle.latent_shape_for(DiffusionSamplingParams(height=H, width=W, num_frames=6))
    with pytest.raises(ValueError, match=r"multiples of 16"):
        bundle.latent_shape_for(DiffusionSamplingParams(height=40, width=W, num_frames=5))


@torch.no_grad()
def test_tiny_decoder_moves_every_frame_with_the_latent(bundle) -> None:
    """Brightness of every decoded frame follows a latent direction monotonically (corr > 0.9),
    so pixel rewards can learn; the frames after the first (the temporal upsamplers) too."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(1, 16, 2, 4, 6, generator=gen)
    direction = torch.randn(1, 16, 1, 1, 1, generator=gen)
    scales = torch.linspace(-1.5, 1.5, 7)
    videos = bundle.decode(torch.cat([base + s * direction for s in scales]))
    assert videos.shape == (7, FRAMES, 3, H, W) and videos.dtype == torch.float32
    assert float(videos.min()) >= 0.0 and float(videos.max()) <= 1.0
    brightness = videos.mean(dim=(2, 3, 4))  # [7, T]
    for t in range(FRAMES):
        corr = np.corrcoef(scales.numpy(), brightness[:, t].numpy())[0, 1]
        assert abs(corr) > 0.9, (t, corr)
    assert float(brightness[:, 0].max() - brightness[:, 0].min()) > 0.1


# -- Wan 2.2: two experts ----------------------------------------------------------------------


def test_experts_switch_at_the_boundary_sigma(experts) -> None:
    assert experts.two_experts and experts.boundary_ratio == 0.875
    assert set(experts.trainable_modules) == {"transformer", "transformer_2"}
    assert experts.trainable_attr == "experts" and isinstance(experts.trainable_module, WanExperts)
    calls: list[str] = []
    forward = experts._expert_forward

    def spy(name, *args, **kwargs):
        calls.append(name)
        return forward(name, *args, **kwargs)

    experts._expert_forward = spy  # type: ignore[method-assign]
    try:
        cond = experts.encode_prompts(["a cat", "a dog"])
        x = torch.randn(2, 16, 2, 4, 6, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            v_at = experts.predict_velocity(x, torch.tensor([0.875, 0.875]), cond)
            v_below = experts.predict_velocity(x, torch.tensor([0.8749, 0.8749]), cond)
            mixed = experts.predict_velocity(x, torch.tensor([0.9, 0.3]), cond)
            high = experts.predict_velocity(
                x[:1], torch.tensor([0.9]), cond.select(torch.tensor([0]))
            )
            low = experts.predict_velocity(
                x[1:], torch.tensor([0.3]), cond.select(torch.tensor([1]))
            )
    finally:
        del experts._expert_forward
    # σ = boundary runs the high-noise expert (diffusers: t >= boundary_ratio·1000)
    assert calls[:2] == ["transformer", "transformer_2"]
    assert not torch.equal(v_at, v_below)
    # a batch with rows on both sides runs each expert on its rows
    assert calls[2:4] == ["transformer", "transformer_2"]
    assert torch.allclose(mixed, torch.cat([high, low]), atol=1e-6, rtol=0)


def test_one_expert_trains_and_the_other_is_frozen() -> None:
    high = make("tiny-wan2.2", train_experts="high")
    assert high.trainable_attr == "transformer" and list(high.trainable_modules) == ["transformer"]
    assert high.trainable_module is high.transformer
    assert set(high.frozen_experts) == {"transformer_2"}
    assert not any(p.requires_grad for p in high.transformer_2.parameters())
    low = make("tiny-wan2.2", train_experts="low", boundary_ratio=0.5)
    assert low.trainable_attr == "transformer_2" and list(low.trainable_modules) == [
        "transformer_2"
    ]
    assert low.boundary_ratio == 0.5  # the field overrides model_index.json's 0.875
    cond = high.encode_prompts(["a cat"])
    x = torch.randn(1, 16, 2, 4, 6)
    high.transformer.requires_grad_(True)
    v = high.predict_velocity(x, torch.tensor([0.95]), cond)  # the trained expert: grads flow
    assert v.requires_grad
    with pytest.raises(ValueError, match=r"σ=0.5 runs the frozen transformer_2 .*sde_steps"):
        high.predict_velocity(x, torch.tensor([0.5]), cond)
    with torch.no_grad():  # the frozen expert still samples
        high.predict_velocity(x, torch.tensor([0.5]), cond)
    # the backend writing both experts where one lives is refused, naming the fix
    with pytest.raises(ValueError, match=r"set backend.trainable_attr: transformer"):
        high.transformer = high.experts


def test_expert_settings_a_model_cannot_take_are_refused(bundle) -> None:
    assert not bundle.two_experts and bundle.trainable_attr == "transformer"
    assert list(bundle.trainable_modules) == ["transformer"]
    with pytest.raises(ConfigError, match=r"train_experts=low but this Wan model has one"):
        make(train_experts="low")
    with pytest.raises(ConfigError, match=r"boundary_ratio is set but this Wan model has one"):
        make(boundary_ratio=0.9)
    with pytest.raises(ConfigError, match=r"train_experts='all' must be one of"):
        make(train_experts="all")


def test_backend_defaults_to_the_bundles_trainable_attr_and_export_splits_the_experts(
    tmp_path: Path,
) -> None:
    """No ``trainable_attr`` given: the backend wraps ``bundle.experts`` (both experts) and
    ``export_lora`` leaves the combined file plus one diffusers folder per expert, keys
    ``transformer.*`` holding exactly that expert's adapter."""
    from safetensors.torch import load_file

    from unirl.train import FSDPBackend, LoraConfig

    both = make("tiny-wan2.2")
    backend = FSDPBackend(bundle=both, lora=LoraConfig(rank=2, alpha=2), param_dtype="fp32")
    assert backend.trainable_attr == "experts" and both.experts is backend.module
    backend.export_lora(tmp_path / "lora")
    combined = load_file(str(tmp_path / "lora" / "pytorch_lora_weights.safetensors"))
    for name in ("transformer", "transformer_2"):
        part = load_file(str(tmp_path / "lora" / name / "pytorch_lora_weights.safetensors"))
        prefix = f"transformer.{name}."
        expected = {
            "transformer." + k[len(prefix) :]: v
            for k, v in combined.items()
            if k.startswith(prefix)
        }
        assert part.keys() == expected.keys() and len(part) == 2 * 4 * 2 * 2  # A, B x 4 x 2 x 2
        assert all(torch.equal(part[k], expected[k]) for k in part)
    # one trained expert (or Wan 2.1): the export is diffusers' form already, no sub-folders
    low = make("tiny-wan2.2", train_experts="low")
    backend = FSDPBackend(bundle=low, lora=LoraConfig(rank=2, alpha=2), param_dtype="fp32")
    assert backend.trainable_attr == "transformer_2" and low.transformer_2 is backend.module
    backend.export_lora(tmp_path / "low")
    assert sorted(p.name for p in (tmp_path / "low").iterdir() if p.is_dir()) == []


def test_split_expert_lora_refuses_a_single_expert_export(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(2, 2)},
        str(tmp_path / "pytorch_lora_weights.safetensors"),
    )
    with pytest.raises(ValueError, match=r"not an export of both Wan experts"):
        split_expert_lora(tmp_path)


# -- image-to-video ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def i2v() -> SimpleNamespace:
    gen = torch.Generator().manual_seed(0)
    frame = (torch.rand(3, H, W, generator=gen) * 255).round().to(torch.uint8)
    # I2V text is 512 tokens: the transformer splits its context as [image tokens; last 512]
    return SimpleNamespace(bundle=make("tiny-i2v", max_sequence_length=512), frame=frame)


def test_i2v_sampling_equals_diffusers_image_to_video(i2v, monkeypatch) -> None:
    import diffusers.pipelines.wan.pipeline_wan as t2v_module
    import diffusers.pipelines.wan.pipeline_wan_i2v as i2v_module
    import PIL.Image
    from family_tester import run_diffusers

    # diffusers 0.42.1's I2V prompt cleaning calls ftfy even when it is not installed; the T2V
    # module's cleaning is the same function with the availability check
    monkeypatch.setattr(i2v_module, "prompt_clean", t2v_module.prompt_clean)
    bundle, frame = i2v.bundle, i2v.frame
    assert bundle.is_i2v and bundle.uses_image_embeds
    prompts = ["a red fox in the snow", "a neon sign"]
    pixels = (frame.float() / 255).expand(2, 3, H, W).clone()
    req = video_request(bundle, prompts, steps=4, images=pixels)
    track = WanPipeline(bundle=bundle, strategy=ODE()).generate(req).tracks["diffusion"]
    cond = track.conditions
    assert cond.image_condition.shape == (2, 20, 2, 4, 6) and cond.image_embeds.shape == (2, 17, 32)
    pipe = load_reference("tiny-i2v")
    x_T = req.params_for("diffusion", DiffusionRequest).initial_noise(req.seed)
    image = PIL.Image.fromarray(frame.permute(1, 2, 0).numpy())
    kwargs = dict(
        prompts=prompts,
        negative_prompt="",
        guidance_scale=4.0,
        num_inference_steps=4,
        height=H,
        width=W,
        num_frames=FRAMES,
        latents=x_T,
        max_sequence_length=512,
    )
    latents, frames = run_diffusers(pipe, image=image, **kwargs)
    gap = float((track.segment.final_latents - latents).abs().max())
    assert gap <= 1e-5, gap  # batched vs separate CFG forwards: fp32 rounding only
    assert float((track.decoded.frames - frames).abs().max()) <= 1e-5
    other = PIL.Image.fromarray((255 - frame).permute(1, 2, 0).numpy())
    moved = float((run_diffusers(pipe, image=other, **kwargs)[0] - latents).abs().max())
    assert moved > 0.1, moved  # the first frame conditions the video


def test_i2v_replay_reproduces_logprobs_bit_for_bit(i2v) -> None:
    bundle = i2v.bundle
    pixels = (i2v.frame.float() / 255).expand(2, 3, H, W).clone()
    pipeline = WanPipeline(bundle=bundle, strategy=FlowSDE(eta=0.7))
    req = video_request(bundle, ["a cat", "a dog"], steps=3, sde=(0, 1), images=pixels)
    track = pipeline.generate(req).tracks["diffusion"]
    with torch.no_grad():
        for slot in range(2):
            record = pipeline.replay(track.conditions, track.segment, slot)
            assert torch.equal(record.log_prob, track.segment.sde_logp[:, slot]), slot


def test_first_frames_are_refused_where_they_do_not_fit(bundle, i2v) -> None:
    pixels = torch.rand(1, 3, H, W)
    cond = bundle.encode_prompts(["a cat"]).with_video_shape(FRAMES, H, W)
    with pytest.raises(ValueError, match=r"text-to-video Wan model and takes no first frames"):
        bundle.encode_references(cond, pixels)
    with pytest.raises(ValueError, match=r"no video_shape"):
        i2v.bundle.encode_references(i2v.bundle.encode_prompts(["a cat"]), pixels)
    sized = i2v.bundle.encode_prompts(["a cat"]).with_video_shape(FRAMES, H, W)
    with pytest.raises(ValueError, match=r"resize the reference images"):
        i2v.bundle.encode_references(sized, torch.rand(1, 3, 64, 64))
    with pytest.raises(ValueError, match=r"every prompt needs a first frame"):
        i2v.bundle.predict_velocity(torch.randn(1, 16, 2, 4, 6), 0.5, sized)


# -- checks before anything is built ---------------------------------------------------------------


def recipe(**blocks: object) -> SimpleNamespace:
    return SimpleNamespace(**{"sampling": {}, "backend": {}, **blocks})


def test_check_config_names_the_field_and_the_fix() -> None:
    WanBundle.check_config({"path": "tiny"}, recipe(sampling={"num_frames": 81, "height": 480}))
    with pytest.raises(ConfigError, match=r"num_frames=80 must be 4·k"):
        WanBundle.check_config({"path": "tiny"}, recipe(sampling={"num_frames": 80}))
    with pytest.raises(ConfigError, match=r"sampling.height=40 is not a multiple of 16"):
        WanBundle.check_config({"path": "tiny"}, recipe(sampling={"height": 40}))
    # no trainable_attr (or null): the backend takes the bundle's, nothing to refuse
    for backend in ({"_target_": "unirl.train.FSDPBackend"}, {"trainable_attr": None}):
        WanBundle.check_config({"path": "tiny-wan2.2"}, recipe(backend=backend))
    wrong = recipe(backend={"_target_": "unirl.train.FSDPBackend", "trainable_attr": "transformer"})
    with pytest.raises(ConfigError, match=r"set backend.trainable_attr: experts \(or drop it"):
        WanBundle.check_config({"path": "tiny-wan2.2"}, wrong)
    WanBundle.check_config(
        {"path": "tiny-wan2.2"}, recipe(backend={"trainable_attr": "experts", "lora": None})
    )
    with pytest.raises(ConfigError, match=r"set backend.trainable_attr: transformer_2"):
        WanBundle.check_config({"path": "wan2.2-14b-arch", "train_experts": "low"}, wrong)
    with pytest.raises(ConfigError, match=r"train_experts=high but this Wan model has one"):
        WanBundle.check_config({"path": "wan2.1-1.3b-arch", "train_experts": "high"}, recipe())
    # CLIP image tokens first, then exactly 512 text tokens (diffusers' split); T2V: any length
    WanBundle.check_config({"path": "tiny-i2v", "max_sequence_length": 512}, recipe())
    WanBundle.check_config({"path": "tiny", "max_sequence_length": 32}, recipe())
    with pytest.raises(ConfigError, match=r"max_sequence_length=32 but .* set bundle.max_seq"):
        WanBundle.check_config({"path": "tiny-i2v", "max_sequence_length": 32}, recipe())
    with pytest.raises(ConfigError, match=r"max_sequence_length=32 but this Wan image-to-video"):
        make("tiny-i2v")  # TEXT_TOKENS = 32


def test_sources_resolve_offline_and_fail_fast(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tiny_preset_path("tiny-wan2.2")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["boundary_ratio"] == 0.875 and index["transformer_2"][1] == "WanTransformer3DModel"
    with pytest.raises(ModelSourceError, match=r"path=tiny .* path=wan2.1-1.3b-arch"):
        make("nobody-has-this/Wan-9B")
    with pytest.raises(ConfigError, match=r"bundle.path"):
        WanBundle.check_config({"path": str(tmp_path)}, recipe())
    with pytest.raises(TypeError, match=r"unexpected keyword"):
        WanBundle(path="tiny", frames=5)  # type: ignore[call-arg]
