"""HunyuanVideoBundle (1.0) against diffusers' own ``HunyuanVideoPipeline`` pieces on the tiny
preset: both prompt encodings and the template's crop, the σ policy, the embedded guidance
(one forward, the scale reaching the transformer), video geometry, and the refusals; then the
shared bundle contract. (The family contract — ODE sampling, ratio 1, replay, LoRA export,
arch — is ``test_family_hunyuan_video_v1.py``.)"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from bundle_contract import BundleContract

from unirl.config import ConfigError
from unirl.models.hunyuan_video_v1 import (
    HunyuanVideoBundle,
    HunyuanVideoBundleConfig,
    HunyuanVideoConditions,
    HunyuanVideoPipeline,
    pipeline_prompt_template,
    resolve_model_source,
    tiny_preset_path,
)
from unirl.sde import ODE, sigmas_from_scheduler_config
from unirl.types import DiffusionSamplingParams

PROMPTS = ["a red fox, oil painting", 'a neon sign that says "OPEN"', ""]
TEXT_TOKENS = 32


def make(**overrides: object) -> HunyuanVideoBundle:
    kwargs: dict = {
        "path": "tiny",
        "dtype": "fp32",
        "text_encoder_dtype": "fp32",
        "device": "cpu",
        "max_sequence_length": TEXT_TOKENS,
    }
    return HunyuanVideoBundle(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def bundle() -> HunyuanVideoBundle:
    return make()


@pytest.fixture(scope="module")
def reference() -> Any:
    from diffusers import HunyuanVideoPipeline as Reference

    from unirl.models.common.progress import hf_progress_bars_disabled

    with hf_progress_bars_disabled():
        pipe = Reference.from_pretrained(tiny_preset_path(), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_defaults_and_template_are_the_pipelines(bundle: HunyuanVideoBundle) -> None:
    """The config's length, the template, its crop and the hidden layer are diffusers' own;
    the tiny tokenizer splits the template's prefix into exactly the crop's 95 tokens."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    template = pipeline_prompt_template()
    assert HunyuanVideoBundleConfig().max_sequence_length == template.max_sequence_length == 256
    assert template.template == DEFAULT_PROMPT_TEMPLATE["template"]
    assert template.crop_start == DEFAULT_PROMPT_TEMPLATE["crop_start"] == 95
    assert template.hidden_layers_to_skip == 2 and template.clip_max_length == 77
    prefix = template.template.split("{}")[0]
    assert len(bundle.tokenizer(prefix).input_ids) == template.crop_start
    # the prompt's first token is the first one kept
    ids = bundle.tokenizer(template.template.format("fox")).input_ids
    assert bundle.tokenizer.decode(ids[template.crop_start :]).startswith("fox")


@torch.no_grad()
def test_encode_prompts_equals_the_pipelines_encode_prompt(
    bundle: HunyuanVideoBundle, reference: Any
) -> None:
    ours = bundle.encode_prompts(PROMPTS)
    embeds, pooled, mask = reference.encode_prompt(
        prompt=PROMPTS, device=torch.device("cpu"), max_sequence_length=TEXT_TOKENS
    )
    assert torch.equal(ours.prompt_embeds, embeds)
    assert torch.equal(ours.prompt_mask, mask.long())
    assert torch.equal(ours.pooled, pooled)
    assert ours.prompt_embeds.shape == (3, TEXT_TOKENS, 32) and ours.pooled.shape == (3, 24)
    # the empty prompt still keeps its template's end token; different prompts differ
    assert int(ours.prompt_mask[2].sum()) >= 1
    assert not torch.equal(ours.pooled[0], ours.pooled[1])


def test_sigmas_are_the_pipelines(bundle: HunyuanVideoBundle, reference: Any) -> None:
    for steps in (4, 8, 30):
        ours = bundle.sigmas(steps, 32, 48)
        reference.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
        assert torch.equal(ours, reference.scheduler.sigmas.float()), steps
    policy = sigmas_from_scheduler_config({**bundle.scheduler_config, "shift": 3.0}, 4)
    assert not torch.equal(policy, bundle.sigmas(4, 32, 48))  # the shift is read (7.0)
    assert bundle.scheduler_config["shift"] == 7.0
    assert make(flow_shift=3.0).sigmas(4, 32, 48).equal(policy)


@torch.no_grad()
def test_embedded_guidance_is_one_forward_with_the_scale(bundle: HunyuanVideoBundle) -> None:
    """Any scale runs one conditional forward per step (no negative rows, no second pass);
    the scale reaches the transformer as g·1000, so two scales give two velocities."""
    pipeline = HunyuanVideoPipeline(bundle=bundle, strategy=ODE())
    params = DiffusionSamplingParams(
        num_inference_steps=2, guidance_scale=6.0, height=32, width=48, num_frames=5
    )
    conditions = pipeline.encode(["a red fox"], params, params.guidance_scale)
    assert isinstance(conditions, HunyuanVideoConditions) and conditions.guidance is None
    rows: list[int] = []
    seen: list[float] = []

    def record(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        rows.append(kwargs["hidden_states"].shape[0])
        seen.append(float(kwargs["guidance"][0]))

    hooks = [bundle.transformer.register_forward_pre_hook(record, with_kwargs=True)]
    try:
        x = torch.randn(1, *bundle.video_latent_shape(5, 32, 48))
        sigma = torch.tensor([0.7])
        fwd = pipeline.guidance.forward_conditions(bundle, conditions, 6.0)
        v6 = pipeline.guidance.velocity(bundle, x, sigma, fwd, 6.0)
        fwd1 = pipeline.guidance.forward_conditions(bundle, conditions, 1.0)
        v1 = pipeline.guidance.velocity(bundle, x, sigma, fwd1, 1.0)
    finally:
        for hook in hooks:
            hook.remove()
    assert rows == [1, 1]  # one row per forward: no unconditional branch
    assert seen == [6000.0, 1000.0]
    assert float((v6 - v1).abs().max()) > 1e-4


def test_predict_velocity_refuses_conditions_without_guidance(bundle: HunyuanVideoBundle) -> None:
    conditions = bundle.encode_prompts(["a cat"])
    x = torch.randn(1, *bundle.video_latent_shape(1, 32, 48))
    with pytest.raises(ConfigError, match="no guidance scale"):
        bundle.predict_velocity(x, 0.5, conditions)


def test_video_geometry_and_frame_refusal(bundle: HunyuanVideoBundle) -> None:
    assert bundle.video_latent_shape(9, 32, 48) == (16, 3, 4, 6)
    params = SimpleNamespace(num_frames=5, height=64, width=32)
    assert bundle.latent_shape_for(params) == (16, 2, 8, 4)
    recipe = type("Recipe", (), {"sampling": {"height": 32, "width": 48, "num_frames": 6}})()
    with pytest.raises(ConfigError, match=r"num_frames=6 must be 4·k \+ 1.*use 5 or 9"):
        HunyuanVideoBundle.check_config({"path": "tiny"}, recipe)


def test_a_hunyuan_video15_folder_is_refused_naming_the_15_bundle(tmp_path: Path) -> None:
    folder = tmp_path / "hv15"
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "HunyuanVideo15Pipeline"}))
    with pytest.raises(ConfigError, match="HunyuanVideo15Bundle"):
        make(path=str(folder))


class TestHunyuanVideoBundleContract(BundleContract):
    bundle_class = HunyuanVideoBundle
    bundle_fields: ClassVar[dict[str, Any]] = {"max_sequence_length": TEXT_TOKENS}
    family_label = "HunyuanVideo 1.0"
    arch_preset = "hunyuan-video-arch"
    resolve_model_source = staticmethod(resolve_model_source)
    decoder_channel_dim = 0  # [C, F, h, w]
    decoder_monotone = True

    def check_built(self, built: HunyuanVideoBundle) -> None:
        assert built.encode_prompts(["a cat"]).prompt_embeds.shape == (1, TEXT_TOKENS, 32)
        assert built.block_class_names == (
            "HunyuanVideoTransformerBlock",
            "HunyuanVideoSingleTransformerBlock",
        )
