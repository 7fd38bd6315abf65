"""``VllmOmniEngine`` fed what vLLM-Omni 0.30.0 itself returns from ``Omni.generate``.

``tests/fixtures/engines/record_vllm_omni.py`` ran the real engine (tiny SD3 bundle) against
the released ``StableDiffusion3Pipeline.forward`` and output assembly
(``DiffusionEngine.postprocess_output`` -> ``OmniRequestOutput.from_stage_output``), with only
the transformer forward and the VAE decode stood in (``StandInSD3Transformer``,
``StandInVae``), and stored the ``OmniRequestOutput`` objects field by field
(``generate_outputs.json``; tensors and PIL images as arrays in
``generate_outputs.safetensors``). Here they are rebuilt as they came and returned by the
``Omni`` object's ``generate``; everything above it (``OmniBackend.generate``,
``VllmOmniEngine.generate``) is unirl's real code.

What the release returns: one ``OmniRequestOutput`` per call, ``images`` a list of PIL images,
and ``trajectory_latents`` / ``trajectory_timesteps`` / ``trajectory_log_probs`` all ``None``
(0.30.0's SD3 pipeline ignores ``return_trajectory_latents``; only Bagel's records one). So the
adapter must refuse with one line, and the pixels show that the release sampled from the
engine's pinned x_T with the request's σ schedule.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import numpy as np
import pytest
import released_cases as cases
import torch
from rollout_fakes import BUNDLE_BLOCK, make_request, stage

from unirl.rollout import VllmOmniEngine
from unirl.rollout.engine.dedicated.trajectory import EngineContractError, pixels_from_output
from unirl.rollout.engine.vllm_omni.backend import OmniBackend
from unirl.rollout.engine.vllm_omni.engine import per_request

TREE = cases.VLLM_OMNI_DIR / "generate_outputs.json"
TENSORS = cases.VLLM_OMNI_DIR / "generate_outputs.safetensors"
pytestmark = pytest.mark.skipif(
    not (TREE.exists() and TENSORS.exists()),
    reason=f"fixture missing: run tests/fixtures/engines/record_vllm_omni.py ({TREE.parent})",
)


def _record() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return json.loads(TREE.read_text()), load_file(str(TENSORS))


def rebuild(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The recorded value: tensors as saved, PIL images from their uint8 arrays."""
    if isinstance(node, dict) and "tensor" in node:
        return tensors[node["tensor"]]
    if isinstance(node, dict) and "pil" in node:
        from PIL import Image

        return Image.fromarray(tensors[node["pil"]].numpy(), mode=node["mode"])
    if isinstance(node, dict) and "dict" in node:
        return {k: rebuild(v, tensors) for k, v in node["dict"].items()}
    if isinstance(node, dict) and "list" in node:
        return [rebuild(v, tensors) for v in node["list"]]
    return node


def rebuilt_output(recorded: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    """An object of the recorded class name carrying every recorded dataclass field (and the
    ``custom_output`` / ``multimodal_output`` properties' values)."""
    fields = {k: rebuild(v, tensors) for k, v in recorded["fields"].items()}
    cls = type(recorded["class"], (), {"__module__": recorded["module"]})
    out = cls()
    for name, value in fields.items():
        setattr(out, name, value)
    out.custom_output = fields["_custom_output"]
    out.multimodal_output = fields["_multimodal_output"]
    return out


class RecordedOmni:
    """``Omni`` with ``generate`` answering from the recording, after checking that the engine
    sent exactly the recorded request (prompt dict and every sampling field the release saw)."""

    def __init__(self, record: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.calls = record["calls"]
        self.tensors = tensors
        self.served = 0

    def generate(self, prompt: Any, params: Any) -> list[Any]:
        call = self.calls[self.served]
        self.served += 1
        _assert_same(prompt, rebuild(call["prompt"], self.tensors), "prompt")
        for key, value in rebuild(call["sampling_params"], self.tensors).items():
            _assert_same(getattr(params, key), value, f"params.{key}")
        return [rebuilt_output(o, self.tensors) for o in call["outputs"]]


def _assert_same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.dtype == want.dtype and torch.equal(got, want), where
    else:
        assert got == want, where


@pytest.fixture()
def released_backend(monkeypatch: pytest.MonkeyPatch) -> OmniBackend:
    # OmniBackend.generate builds OmniDiffusionSamplingParams(**params); the keyword holder
    # stands in for the class (the recording lists every field the release received)
    module = types.ModuleType("vllm_omni.inputs.data")
    module.OmniDiffusionSamplingParams = types.SimpleNamespace  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm_omni", types.ModuleType("vllm_omni"))
    monkeypatch.setitem(sys.modules, "vllm_omni.inputs", types.ModuleType("vllm_omni.inputs"))
    monkeypatch.setitem(sys.modules, "vllm_omni.inputs.data", module)
    record, tensors = _record()
    backend = OmniBackend.__new__(OmniBackend)
    backend.omni = RecordedOmni(record, tensors)
    backend.log_prob_attr = "trajectory_log_probs"
    return backend


@pytest.fixture(scope="module")
def engine() -> VllmOmniEngine:
    """The real adapter with its own tiny SD3 encoder (the bundle is built once)."""
    return VllmOmniEngine(
        model_path="recorded", encoder=dict(BUNDLE_BLOCK), backend=object(), storage_dtype="fp32"
    )


@pytest.fixture(scope="module")
def sd3_req(engine: VllmOmniEngine):
    bundle = engine.encoder
    return make_request(bundle.scheduler_config, bundle.latent_shape(64, 64))


def test_released_output_has_images_and_no_trajectory() -> None:
    record, tensors = _record()
    assert record["vllm_omni_version"] == cases.VLLM_OMNI_VERSION
    assert record["stand_ins"] == ["transformer.forward", "vae.decode"]
    (call,) = record["calls"]  # the engine stopped at the first answer
    (out,) = [rebuilt_output(o, tensors) for o in call["outputs"]]
    assert type(out).__name__ == "OmniRequestOutput" and out.final_output_type == "image"
    assert [im.size for im in out.images] == [(64, 64)] and out.images[0].mode == "RGB"
    for name in ("trajectory_latents", "trajectory_timesteps", "trajectory_log_probs", "latents"):
        assert getattr(out, name) is None, name
    assert out.finished and out.error is None and out.request_id == "0_fixture"


def test_engine_refuses_the_released_answer_in_one_line(engine, released_backend, sd3_req) -> None:
    engine.backend = released_backend
    with pytest.raises(EngineContractError) as info:
        engine.generate(sd3_req)
    message = str(info.value)
    assert "\n" not in message
    assert "OmniRequestOutput has no trajectory_latents" in message
    assert "trainside, dedicated or sglang" in message
    assert released_backend.omni.served == 1  # the request matched the recorded one exactly
    assert message == _record()[0]["adapter_answer"].split(": ", 1)[1]


def _reference_pixels(
    x_t: torch.Tensor, sigmas: torch.Tensor, prompt: dict[str, Any], guidance: float
) -> np.ndarray:
    """float64 replay of the released SD3 loop on the stand-ins (velocity
    ``(1.5 - 3 t) x + t + mean(text) + mean(pooled)``, t = σ): Euler on σ with CFG
    ``n + g (p - n)``, decode ``tanh`` of the first 3 channels (x8), then diffusers'
    ``VaeImageProcessor`` to uint8 (``(x / 2 + 0.5).clamp(0, 1) * 255``, rounded)."""
    info = prompt["additional_information"]
    pos = prompt["prompt_embeds"].double().mean() + info["pooled_prompt_embeds"].double().mean()
    neg = (
        prompt["negative_prompt_embeds"].double().mean()
        + info["negative_pooled_prompt_embeds"].double().mean()
    )
    x = x_t.double()
    for i in range(len(sigmas) - 1):
        t = float(sigmas[i].float() * 1000) / 1000.0
        v_pos, v_neg = (1.5 - 3.0 * t) * x + t + pos, (1.5 - 3.0 * t) * x + t + neg
        x = x + (float(sigmas[i + 1]) - float(sigmas[i])) * (v_neg + guidance * (v_pos - v_neg))
    image = torch.tanh(x[:3] / 1.5305 + 0.0609).repeat_interleave(8, -1).repeat_interleave(8, -2)
    image = ((image / 2 + 0.5).clamp(0, 1) * 255).round()
    return image.permute(1, 2, 0).numpy().astype(np.uint8)


def test_released_pixels_come_from_the_pinned_x_t_and_the_request_sigmas(sd3_req) -> None:
    record, tensors = _record()
    (call,) = record["calls"]
    prompt = rebuild(call["prompt"], tensors)
    latents = rebuild(call["sampling_params"], tensors)["latents"]
    x_t = stage(sd3_req).initial_noise(sd3_req.seed)
    assert torch.equal(latents, x_t[:1])  # the engine pinned row 0's x_T
    (out,) = [rebuilt_output(o, tensors) for o in call["outputs"]]
    got = np.array(out.images[0])
    sigmas = stage(sd3_req).sigmas
    want = _reference_pixels(x_t[0], sigmas, prompt, sd3_req.sampling_params.guidance_scale)
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.99  # fp32 release vs fp64 replay
    # the check can fail: another σ schedule or another x_T gives other pixels
    shifted = _reference_pixels(x_t[0], sigmas**2, prompt, sd3_req.sampling_params.guidance_scale)
    other = _reference_pixels(x_t[1], sigmas, prompt, sd3_req.sampling_params.guidance_scale)
    for wrong in (shifted, other):
        assert np.abs(got.astype(np.int16) - wrong.astype(np.int16)).max() > 8
    # and the adapter's image path reads the release's PIL image exactly
    pixels = pixels_from_output([torch.from_numpy(got.copy())])
    assert pixels.shape == (1, 3, 64, 64)
    assert torch.equal(pixels[0], torch.from_numpy(got).permute(2, 0, 1).float() / 255.0)


def test_prompt_tensors_go_without_a_batch_dim() -> None:
    rows = {"prompt_embeds": torch.ones(1, 3, 2), "additional_information": {"p": torch.ones(1, 4)}}
    one = per_request(rows)
    assert one["prompt_embeds"].shape == (3, 2) and one["additional_information"]["p"].shape == (4,)
    with pytest.raises(EngineContractError, match="'prompt_embeds' has shape \\[2, 3, 2\\]"):
        per_request({"prompt_embeds": torch.ones(2, 3, 2)})
