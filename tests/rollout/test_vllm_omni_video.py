"""vLLM-Omni adapter on the video families (HunyuanVideo 1.5, Wan T2V), against a fake video
server: frames and fps reach the engine, x_T is pinned in ``[N, C, F, h, w]``, the segment's
latents / log-probs are exactly the server's at the SDE steps, and decoded frames come back as
``Videos``; image families stay image-only."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rollout_fakes import BUNDLE_BLOCK, PROMPTS

from unirl.config import ConfigError
from unirl.models.common.engine_maps import EngineMapError, engine_maps_for
from unirl.models.hunyuan_video import HunyuanVideo15Bundle, HunyuanVideo15Conditions
from unirl.models.hunyuan_video.engine_maps import HunyuanVideo15EngineMaps
from unirl.models.sd3.engine_maps import SD3EngineMaps
from unirl.models.wan import WanBundle, WanConditions
from unirl.models.wan.engine_maps import WanEngineMaps
from unirl.rollout import VllmOmniEngine
from unirl.rollout.engine.dedicated.trajectory import EngineContractError
from unirl.rollout.engine.vllm_omni.video import frames_from_output
from unirl.types import (
    DiffusionRequest,
    DiffusionSamplingParams,
    Images,
    RolloutReq,
    Texts,
    Videos,
)

COMMON = {"dtype": "fp32", "text_encoder_dtype": "fp32", "vae_dtype": "fp32", "device": "cpu"}
HUNYUAN_BLOCK = {
    "_target_": "unirl.models.hunyuan_video.HunyuanVideo15Bundle",
    "path": "tiny",
    **COMMON,
    "max_sequence_length": 16,
    "glyph_max_sequence_length": 8,
    "image_tokens": 0,
}
WAN_BLOCK = {
    "_target_": "unirl.models.wan.WanBundle",
    "path": "tiny",
    **COMMON,
    "max_sequence_length": 16,
}
FRAMES, FPS, HEIGHT, WIDTH, STEPS = 5, 8.0, 32, 48, 4


def video_request(bundle: Any, *, spp: int = 2, frames: int = FRAMES) -> RolloutReq:
    """2 prompts x ``spp`` videos of ``frames`` frames at 32x48, 4 steps, SDE steps 0 and 2."""
    sampling = DiffusionSamplingParams(
        num_inference_steps=STEPS,
        guidance_scale=4.5,
        height=HEIGHT,
        width=WIDTH,
        num_frames=frames,
        fps=FPS,
        eta=0.7,
        samples_per_prompt=spp,
        max_sequence_length=16,
    )
    n = len(PROMPTS) * spp
    sample_ids = torch.arange(200, 200 + n)
    return RolloutReq(
        sample_ids=sample_ids,
        group_ids=torch.arange(len(PROMPTS)).repeat_interleave(spp),
        primitives={"text": Texts(texts=[p for p in PROMPTS for _ in range(spp)])},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=sample_ids.clone(),
                sde_indices=torch.tensor([[0, 2]] * n),
                sigmas=bundle.sigmas(STEPS, HEIGHT, WIDTH),
                init_noise_shape=tuple(bundle.latent_shape_for(sampling)),
            )
        },
        sampling_params=sampling,
        seed=11,
        rollout_index=0,
    )


def stage(req: RolloutReq) -> DiffusionRequest:
    return req.params_for("diffusion", DiffusionRequest)


class FakeVideoOmni:
    """A vLLM-Omni video pipeline: honours pinned ``[k, C, F, h, w]`` latents, returns each
    sample's dense trajectory ``[T+1, C, F, h, w]`` (x_T first), timesteps σ·1000, per-step
    log-probs and its decoded video frame-first ``[num_frames, H, W, 3]`` uint8. Everything it
    produced is kept in ``produced`` (in call order)."""

    def __init__(self, sigmas: torch.Tensor) -> None:
        self.sigmas = sigmas
        self.calls: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.produced: list[dict[str, Any]] = []
        self.gen = torch.Generator().manual_seed(0)
        self.frames_override: int | None = None

    def generate(self, prompt: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append((prompt, params))
        steps = params["num_inference_steps"]
        frames = self.frames_override or params["num_frames"]
        out = []
        for x_t in params["latents"]:
            sample = {
                "image": torch.randint(
                    0, 256, (frames, params["height"], params["width"], 3), generator=self.gen
                ).to(torch.uint8),
                "trajectory_latents": torch.cat(
                    [x_t[None], torch.randn(steps, *x_t.shape, generator=self.gen)]
                ),
                "trajectory_timesteps": self.sigmas[:-1] * 1000,
                "log_probs": torch.randn(steps, generator=self.gen),
            }
            self.produced.append(sample)
            out.append(sample)
        return out

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


@pytest.fixture(scope="module")
def hunyuan() -> tuple[Any, Any]:
    """``(bundle, engine)``: the tiny HunyuanVideo 1.5 (for σ and geometry) and an adapter
    built from the recipe-style block (its own encoder copy, transformer freed)."""
    bundle = HunyuanVideo15Bundle(**{k: v for k, v in HUNYUAN_BLOCK.items() if k != "_target_"})
    fake = FakeVideoOmni(bundle.sigmas(STEPS, HEIGHT, WIDTH))
    engine = VllmOmniEngine(
        model_path="fake", encoder=dict(HUNYUAN_BLOCK), backend=fake, storage_dtype="fp32"
    )
    return bundle, engine


@pytest.fixture(scope="module")
def wan() -> tuple[Any, Any]:
    bundle = WanBundle(**{k: v for k, v in WAN_BLOCK.items() if k != "_target_"})
    fake = FakeVideoOmni(bundle.sigmas(STEPS, HEIGHT, WIDTH))
    engine = VllmOmniEngine(
        model_path="fake", encoder=dict(WAN_BLOCK), backend=fake, storage_dtype="fp32"
    )
    return bundle, engine


def check_round_trip(bundle: Any, engine: Any) -> tuple[Any, RolloutReq]:
    """One video request; asserts what every video family shares and returns the track."""
    fake = engine.backend
    fake.calls.clear()
    fake.produced.clear()
    req = video_request(bundle)
    track = engine.generate(req).tracks["diffusion"]
    x_t = stage(req).initial_noise(req.seed)
    latent = bundle.latent_shape_for(req.sampling_params)
    assert x_t.shape == (4, *latent) and len(latent) == 4  # [C, F, h, w], F = (5 - 1) / 4 + 1
    assert latent[1] == 2
    # one call per sample (vLLM-Omni 0.30 does not repeat given embeddings over
    # num_outputs_per_prompt), frames and fps from the sampling params, x_T pinned as is
    assert len(fake.calls) == 4
    for i, (prompt, params) in enumerate(fake.calls):
        assert params["num_frames"] == FRAMES and params["fps"] == FPS
        assert (params["height"], params["width"]) == (HEIGHT, WIDTH)
        assert params["guidance_scale"] == 4.5 and params["num_outputs_per_prompt"] == 1
        assert torch.equal(params["latents"], x_t[i : i + 1])
        assert prompt["prompt"] == PROMPTS[i // 2] and prompt["prompt_embeds"].ndim == 2
    # the segment is the server's trajectory at the SDE steps [0, 2], element for element
    traj = torch.stack([s["trajectory_latents"] for s in fake.produced])
    logp = torch.stack([s["log_probs"] for s in fake.produced])
    seg = track.segment
    assert seg.latents.shape == (4, 2, *latent)
    assert torch.equal(seg.latents, traj[:, [0, 2]])
    assert torch.equal(seg.next_latents, traj[:, [1, 3]])
    assert torch.equal(seg.final_latents, traj[:, -1])
    assert torch.equal(seg.latents[:, 0], x_t)
    assert seg.sde_logp is not None and torch.equal(seg.sde_logp, logp[:, [0, 2]])
    # decoded frames -> Videos [N, T, 3, H, W] in [0, 1] at the request's fps
    assert isinstance(track.decoded, Videos) and track.decoded.fps == FPS
    assert track.decoded.frames.shape == (4, FRAMES, 3, HEIGHT, WIDTH)
    video = torch.stack([s["image"] for s in fake.produced]).permute(0, 1, 4, 2, 3)
    assert torch.equal(track.decoded.frames, video.float() / 255.0)
    return track, req


def test_hunyuan_video_round_trip(hunyuan: tuple[Any, Any]) -> None:
    bundle, engine = hunyuan
    assert engine.encoder.transformer is None  # our copy: only its encoders are used
    track, _ = check_round_trip(bundle, engine)
    cond = track.conditions
    assert isinstance(cond, HunyuanVideo15Conditions) and cond.has_negative
    prompt, _ = engine.backend.calls[2]
    extra = prompt["additional_information"]
    # row 2 is the first of the second prompt: its own encodings, one request's tensors
    # (no batch dim: vLLM-Omni stacks the requests it batches)
    assert torch.equal(prompt["prompt_embeds"], cond.prompt_embeds[2])
    assert torch.equal(prompt["negative_prompt_embeds"], cond.negative_prompt_embeds[2])
    assert torch.equal(extra["prompt_embeds_mask"], cond.prompt_mask[2])
    assert torch.equal(extra["prompt_embeds_2"], cond.glyph_embeds[2])
    assert torch.equal(extra["prompt_embeds_mask_2"], cond.glyph_mask[2])
    assert torch.equal(extra["negative_prompt_embeds_mask"], cond.negative_prompt_mask[2])
    assert torch.equal(extra["negative_prompt_embeds_2"], cond.negative_glyph_embeds[2])
    assert torch.equal(extra["negative_prompt_embeds_mask_2"], cond.negative_glyph_mask[2])
    assert extra["prompt_embeds_2"].shape == (8, cond.glyph_embeds.shape[-1])


def test_wan_round_trip(wan: tuple[Any, Any]) -> None:
    bundle, engine = wan
    track, _ = check_round_trip(bundle, engine)
    cond = track.conditions
    assert isinstance(cond, WanConditions)
    prompt, _ = engine.backend.calls[0]
    assert set(prompt) == {"prompt", "prompt_embeds", "negative_prompt_embeds"}
    assert torch.equal(prompt["prompt_embeds"], cond.prompt_embeds[0])
    assert prompt["prompt_embeds"].shape == (16, cond.prompt_embeds.shape[-1])


def test_video_contract_violations_raise(hunyuan: tuple[Any, Any]) -> None:
    bundle, engine = hunyuan
    engine.backend.frames_override = 3
    try:
        with pytest.raises(EngineContractError, match=r"asked for 5 frames, got videos of 3"):
            engine.generate(video_request(bundle))
    finally:
        engine.backend.frames_override = None
    with pytest.raises(EngineContractError, match=r"frame-first \[T, 3, H, W\]"):
        frames_from_output([torch.rand(3, 5, 4, 6)])  # channel-first is not guessed
    got = frames_from_output([torch.rand(5, 3, 4, 6), torch.rand(5, 3, 4, 6)])
    assert got.shape == (2, 5, 3, 4, 6)
    with pytest.raises(EngineMapError, match=r"pinned latents must be \[N, C, F, h, w\]"):
        HunyuanVideo15EngineMaps().to_engine_latents(torch.zeros(2, 32, 2, 2))


def test_wan_i2v_rows_are_refused() -> None:
    rows = WanConditions(
        prompt_embeds=torch.zeros(1, 4, 8), image_condition=torch.zeros(1, 20, 2, 2, 2)
    )
    with pytest.raises(EngineMapError, match=r"image-to-video conditions are not mapped"):
        WanEngineMaps().vllm_omni_prompt(rows, 0)


def test_video_maps_are_found_and_image_families_stay_images() -> None:
    assert type(engine_maps_for(HUNYUAN_BLOCK["_target_"], "vllm_omni")) is HunyuanVideo15EngineMaps
    assert type(engine_maps_for(WanBundle, "vllm_omni")) is WanEngineMaps
    assert WanEngineMaps().vllm_omni_video(9, 16.0) == {"num_frames": 9, "fps": 16.0}
    # no SGLang maps for the video families: refused in one line, as any unmapped family
    with pytest.raises(ConfigError, match=r"the sglang engine has no mapper for family .*Hunyuan"):
        engine_maps_for(HunyuanVideo15Bundle, "sglang")
    sd3 = SD3EngineMaps()
    assert not sd3.video and sd3.vllm_omni_video(1, 16.0) == {}  # image calls unchanged
    with pytest.raises(EngineMapError, match=r"samples images: sampling.num_frames must be 1"):
        sd3.vllm_omni_video(5, 16.0)


def test_image_family_still_returns_images() -> None:
    """SD3 through the same adapter: no frame keys in the call, ``Images`` out."""
    from rollout_fakes import make_request

    from unirl.models.sd3 import SD3Bundle

    bundle = SD3Bundle(**{k: v for k, v in BUNDLE_BLOCK.items() if k != "_target_"})
    req = make_request(bundle.scheduler_config, bundle.latent_shape(64, 64))

    class FakeImageOmni(FakeVideoOmni):
        def generate(self, prompt: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
            self.seen = dict(params)  # what the adapter sent
            out = super().generate(prompt, {**params, "num_frames": 1})
            return [{**s, "image": s["image"][0]} for s in out]  # one [H, W, 3] image

    fake = FakeImageOmni(stage(req).sigmas.clone())
    engine = VllmOmniEngine(model_path="fake", encoder=bundle, backend=fake)
    track = engine.generate(req).tracks["diffusion"]
    assert "num_frames" not in fake.seen and "fps" not in fake.seen
    assert isinstance(track.decoded, Images) and track.decoded.pixels.shape == (4, 3, 64, 64)
