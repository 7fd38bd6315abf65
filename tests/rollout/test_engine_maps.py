"""Per-family engine maps: the external adapters look the mapper up from the family they serve
(the bundle class, ``bundle._target_``), use it for conditions, prompt kwargs, the CFG knob and
the latent layout, and refuse a family without one in one line naming family and engine."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from rollout_fakes import BUNDLE_BLOCK, make_request, stage

from unirl.config import ConfigError
from unirl.models.common.bundle import FlowMatchingBundle
from unirl.models.common.engine_maps import Engine, EngineMaps, engine_maps_for
from unirl.models.qwen_image import QwenImageBundle, QwenImageConditions
from unirl.models.qwen_image.engine_maps import QwenImageEngineMaps
from unirl.models.sd3 import SD3Bundle, SD3Conditions
from unirl.models.sd3.engine_maps import SD3EngineMaps
from unirl.rollout import SGLangEngine, VllmOmniEngine
from unirl.rollout.engine.dedicated.trajectory import EngineContractError
from unirl.types import LatentSegment

QWEN_BLOCK = {
    "_target_": "unirl.models.qwen_image.QwenImageBundle",
    "path": "tiny",
    "dtype": "fp32",
    "text_encoder_dtype": "fp32",
    "vae_dtype": "fp32",
    "device": "cpu",
    "max_sequence_length": 32,
}
QWEN_LATENT = (4, 4, 64)  # tiny Qwen-Image at 64x64: [h, w, 4·C], packed [16, 64] by engines


class UnmappedBundle(FlowMatchingBundle):
    """A family that never declared engine maps."""


class SGLangOnlyMaps(EngineMaps):
    family = "SGLangOnlyBundle"
    engines: ClassVar[tuple[Engine, ...]] = ("sglang",)


class SGLangOnlyBundle(FlowMatchingBundle):
    engine_maps = SGLangOnlyMaps()


# -- lookup ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang", "vllm_omni"])
def test_lookup_picks_the_familys_maps(engine: Engine) -> None:
    assert type(engine_maps_for(SD3Bundle, engine)) is SD3EngineMaps
    assert type(engine_maps_for("unirl.models.sd3.SD3Bundle", engine)) is SD3EngineMaps
    assert type(engine_maps_for(QwenImageBundle, engine)) is QwenImageEngineMaps
    assert type(engine_maps_for(QWEN_BLOCK["_target_"], engine)) is QwenImageEngineMaps
    assert engine_maps_for(SGLangOnlyBundle, "sglang") is SGLangOnlyBundle.engine_maps


@pytest.mark.parametrize(
    ("family", "engine", "name"),
    [
        (UnmappedBundle, "sglang", f"{__name__}.UnmappedBundle"),
        (
            "unirl.models.common.bundle.FlowMatchingBundle",
            "vllm_omni",
            "unirl.models.common.bundle.FlowMatchingBundle",
        ),
        (SGLangOnlyBundle, "vllm_omni", f"{__name__}.SGLangOnlyBundle"),
    ],
)
def test_lookup_refuses_a_family_without_maps(family: Any, engine: Engine, name: str) -> None:
    with pytest.raises(ConfigError) as info:
        engine_maps_for(family, engine)
    message = str(info.value)
    assert message.startswith(f"rollout: the {engine} engine has no mapper for family {name}; ")
    assert "\n" not in message


def test_lookup_refuses_a_family_that_does_not_import() -> None:
    with pytest.raises(
        ConfigError, match=r"cannot import the family 'unirl\.models\.nope\.NopeBundle'"
    ):
        engine_maps_for("unirl.models.nope.NopeBundle", "sglang")


def test_engines_refuse_an_unmapped_family_when_built() -> None:
    with pytest.raises(
        ConfigError, match=r"the sglang engine has no mapper for family .*UnmappedBundle"
    ):
        SGLangEngine(model_path="fake", family=UnmappedBundle, client=object())
    block = {"_target_": "unirl.models.common.bundle.FlowMatchingBundle"}
    with pytest.raises(
        ConfigError, match=r"the vllm_omni engine has no mapper for family unirl\.models\.common\."
    ):
        VllmOmniEngine(model_path="fake", encoder=block, backend=object())


# -- SGLang on Qwen-Image ------------------------------------------------------------------------------


def _qwen_env(length: int, gen: torch.Generator, *, negative: bool = True) -> dict[str, Any]:
    """What SGLang's Qwen-Image denoising stage records: the text states as a one-element list,
    the mask None when every token is real."""
    env: dict[str, Any] = {
        "pos_cond_kwargs": {
            "encoder_hidden_states": [torch.randn(1, length, 32, generator=gen)],
            "encoder_hidden_states_mask": None,
            "txt_seq_lens": [length],
        }
    }
    if negative:
        env["neg_cond_kwargs"] = {
            "encoder_hidden_states": [torch.randn(1, 3, 32, generator=gen)],
            "encoder_hidden_states_mask": torch.ones(1, 3, dtype=torch.bool),
        }
    return env


class FakeQwenSGLang:
    """``/rollout/generate`` of a Qwen-Image server: packed ``[T+1, h·w, 4·C]`` trajectories and
    prompt-length text states (each prompt its own length)."""

    def __init__(self, sigmas: torch.Tensor) -> None:
        self.sigmas = sigmas
        self.calls: list[dict[str, Any]] = []

    def rollout_generate(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append(payload)
        steps, k = payload["num_inference_steps"], payload["num_outputs_per_prompt"]
        gen = torch.Generator().manual_seed(payload["seed"])
        length = 4 + len(payload["prompt"]) % 5
        return [
            {
                "generated_output": torch.rand(3, 64, 64, generator=gen),
                "rollout_log_probs": torch.randn(steps, generator=gen),
                "dit_trajectory": {
                    "latents": torch.randn(steps + 1, 16, 64, generator=gen),
                    "sigmas": self.sigmas,
                },
                "denoising_env": _qwen_env(length, gen),
            }
            for _ in range(k)
        ]


def test_sglang_serves_qwen_image_through_its_maps() -> None:
    req = make_request({"shift": 1.0, "use_dynamic_shifting": False}, QWEN_LATENT)
    server = FakeQwenSGLang(stage(req).sigmas.clone())
    engine = SGLangEngine(
        model_path="fake", family=QWEN_BLOCK["_target_"], client=server, storage_dtype="fp32"
    )
    track = engine.generate(req).tracks["diffusion"]
    assert server.calls[0]["guidance_scale"] == 4.5  # SGLang's Qwen-Image CFG knob
    seg = track.segment
    assert isinstance(seg, LatentSegment)
    assert tuple(seg.latents.shape) == (4, 3, *QWEN_LATENT)
    # the packed trajectory is our latent, element for element
    again = FakeQwenSGLang(stage(req).sigmas.clone()).rollout_generate(dict(server.calls[0]))
    packed = torch.stack([o["dit_trajectory"]["latents"] for o in again])
    assert torch.equal(seg.final_latents[:2], packed[:, -1].reshape(2, *QWEN_LATENT))
    cond = track.conditions
    assert isinstance(cond, QwenImageConditions)
    lengths = [4 + len(p) % 5 for p in req.prompts]
    assert cond.prompt_embeds.shape == (4, max(lengths), 32)
    assert cond.prompt_mask is not None and cond.prompt_mask.sum(1).tolist() == lengths
    assert cond.negative_prompt_embeds is not None and cond.negative_prompt_embeds.shape[1] == 3


def test_qwen_sglang_conditions_without_negatives_and_with_a_missing_key() -> None:
    gen = torch.Generator().manual_seed(0)
    maps = QwenImageEngineMaps()
    cond = maps.sglang_conditions([_qwen_env(5, gen, negative=False)] * 2)
    assert cond.negative_prompt_embeds is None and cond.prompt_mask is None  # one length: no pad
    req = make_request({"shift": 1.0, "use_dynamic_shifting": False}, QWEN_LATENT)
    server = FakeQwenSGLang(stage(req).sigmas.clone())
    server.rollout_generate = lambda p: [  # type: ignore[method-assign]
        {**o, "denoising_env": {"pos_cond_kwargs": {"txt_seq_lens": [4]}}}
        for o in FakeQwenSGLang.rollout_generate(server, p)
    ]
    engine = SGLangEngine(model_path="fake", family=QwenImageBundle, client=server)
    with pytest.raises(EngineContractError, match=r"sglang: denoising_env\.pos_cond_kwargs has no"):
        engine.generate(req)


def test_sd3_sglang_maps_read_the_mmdit_kwargs() -> None:
    env = {
        "pos_cond_kwargs": {
            "encoder_hidden_states": torch.randn(1, 10, 16),
            "pooled_projections": torch.randn(1, 8),
        }
    }
    cond = SD3EngineMaps().sglang_conditions([env, env])
    assert isinstance(cond, SD3Conditions) and cond.prompt_embeds.shape == (2, 10, 16)
    assert cond.negative_prompt_embeds is None  # no neg_cond_kwargs: no CFG


# -- vLLM-Omni on Qwen-Image ---------------------------------------------------------------------------


class FakeQwenOmni:
    """vLLM-Omni's Qwen-Image: takes packed pinned latents, returns packed trajectories."""

    def __init__(self, sigmas: torch.Tensor) -> None:
        self.sigmas = sigmas
        self.calls: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def generate(self, prompt: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls.append((prompt, params))
        steps = params["num_inference_steps"]
        return [
            {
                "image": torch.rand(3, 64, 64),
                "trajectory_latents": torch.cat([x_t[None], torch.randn(steps, *x_t.shape)]),
                "trajectory_timesteps": self.sigmas[:-1] * 1000,
                "log_probs": torch.randn(steps),
            }
            for x_t in params["latents"]
        ]


def test_vllm_omni_serves_qwen_image_through_its_maps() -> None:
    bundle = QwenImageBundle(**{k: v for k, v in QWEN_BLOCK.items() if k != "_target_"})
    req = make_request(bundle.scheduler_config, bundle.latent_shape(64, 64))
    fake = FakeQwenOmni(stage(req).sigmas.clone())
    engine = VllmOmniEngine(
        model_path="fake", encoder=dict(QWEN_BLOCK), backend=fake, storage_dtype="fp32"
    )
    track = engine.generate(req).tracks["diffusion"]
    prompt, params = fake.calls[0]
    x_t = stage(req).initial_noise(req.seed)
    assert params["true_cfg_scale"] == 4.5 and "guidance_scale" not in params
    assert torch.equal(params["latents"], x_t[:1].reshape(1, 16, 64))  # pinned, packed
    extra = prompt["additional_information"]
    assert prompt["prompt_embeds"].ndim == 2 and "pooled_prompt_embeds" not in extra  # [L, D]
    assert extra["prompt_embeds_mask"].shape == prompt["prompt_embeds"].shape[:1]
    assert extra["negative_prompt_embeds_mask"] is not None
    seg = track.segment
    assert torch.equal(seg.latents[:, 0], x_t)  # step 0 trained: x_T itself, in our layout
    assert isinstance(track.conditions, QwenImageConditions)


def test_vllm_omni_sd3_maps_keep_the_pooled_embeddings() -> None:
    bundle = SD3Bundle(**{k: v for k, v in BUNDLE_BLOCK.items() if k != "_target_"})
    cond = bundle.encode_prompts(["a cat", "a dog"], negative=True)
    maps = SD3EngineMaps()
    prompt = maps.vllm_omni_prompt(cond, 1)
    assert torch.equal(prompt["prompt_embeds"], cond.prompt_embeds[1:2])
    extra = prompt["additional_information"]
    assert torch.equal(extra["pooled_prompt_embeds"], cond.pooled_prompt_embeds[1:2])
    assert maps.vllm_omni_guidance(3.0) == {"guidance_scale": 3.0}
    x = torch.randn(2, 16, 8, 8)
    assert maps.to_engine_latents(x) is x and maps.from_engine_latents(x, (16, 8, 8)) is x
