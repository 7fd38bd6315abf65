"""FP8 frozen linears (``fsdp.fp8_frozen``): exact against a float emulation of the same
quantisation, bounded error against fp32, gradients to the input only, and an exactly
on-policy first update on the real tiny SD3 (CPU ``torch._scaled_mm``)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from unirl.config import ConfigError
from unirl.train import FSDPBackend, LoraConfig, OptimizerConfig
from unirl.train.fp8 import (
    E4M3_MAX,
    Fp8Linear,
    convert_frozen_linears,
    fp8_eligible,
    quantize_rowwise,
)

# e4m3 keeps 3 mantissa bits: one rounding is at most 2^-4 relative; a matmul of two rounded
# operands on random data lands near 3%, far below this bound and far above fp32 noise.
FP8_REL_TOL = 0.06


def _frozen_linear(n_in: int, n_out: int, *, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out).requires_grad_(False)


def _emulated(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """The same quantisation in plain fp32: dequantise both operands, then matmul."""
    wq, ws = quantize_rowwise(layer.weight)
    xq, xs = quantize_rowwise(x.reshape(-1, x.shape[-1]))
    y = (xq.float() * xs) @ (wq.float() * ws).t() + layer.bias
    return y.reshape(*x.shape[:-1], -1)


def test_quantize_rowwise_scales_each_row_to_the_e4m3_range() -> None:
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [300.0, 1e-3, -900.0]])
    q, scale = quantize_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 1)
    assert torch.equal(q.float().abs().amax(dim=1)[[0, 2]], torch.tensor([E4M3_MAX, E4M3_MAX]))
    assert torch.equal(q[1].float(), torch.zeros(3))  # an all-zero row stays zero (no NaN)
    assert torch.allclose(q.float() * scale, x, rtol=2**-4, atol=1e-3 * 900 / E4M3_MAX)


def test_forward_equals_the_float_emulation_and_stays_near_fp32() -> None:
    layer = _frozen_linear(64, 48)
    reference = copy.deepcopy(layer)
    assert convert_frozen_linears([nn.Sequential(layer)]) == ["0.0"]
    assert isinstance(layer, Fp8Linear) and isinstance(layer, nn.Linear)
    x = torch.randn(3, 5, 64)
    y = layer(x)
    assert y.shape == (3, 5, 48) and y.dtype == torch.float32
    assert torch.allclose(y, _emulated(x, layer), rtol=1e-6, atol=1e-5)
    rel = float((y - reference(x)).norm() / reference(x).norm())
    assert 1e-4 < rel < FP8_REL_TOL, rel  # really quantised, and within the stated error


def test_backward_reaches_the_input_only_through_the_transposed_fp8_weight() -> None:
    layer = _frozen_linear(32, 64, seed=1)
    reference = copy.deepcopy(layer)
    convert_frozen_linears([nn.Sequential(layer)])
    x = torch.randn(7, 32, requires_grad=True)
    g = torch.randn(7, 64)
    (layer(x) * g).sum().backward()
    assert layer.weight.grad is None and layer.bias.grad is None
    gq, gs = quantize_rowwise(g)
    wtq, wts = quantize_rowwise(reference.weight.t())
    expected = (gq.float() * gs) @ (wtq.float() * wts).t()
    assert torch.allclose(x.grad, expected, rtol=1e-6, atol=1e-5)
    exact = g @ reference.weight
    assert float((x.grad - exact).norm() / exact.norm()) < FP8_REL_TOL


def test_state_dict_is_unchanged_and_ineligible_linears_are_skipped() -> None:
    model = nn.ModuleDict(
        {
            "proj": _frozen_linear(32, 32),
            "norm": nn.ModuleDict({"linear": _frozen_linear(32, 64)}),  # adaLN: excluded by name
            "odd": _frozen_linear(30, 32),  # not a multiple of 16
            "trained": nn.Linear(32, 32),
        }
    )
    keys = list(model.state_dict())
    assert convert_frozen_linears([model]) == ["0.proj"]
    assert list(model.state_dict()) == keys  # the FP8 copies are non-persistent buffers
    assert fp8_eligible(model["odd"]) is not None and "multiple of 16" in fp8_eligible(model["odd"])
    assert "trains" in fp8_eligible(model["trained"])
    assert type(model["norm"]["linear"]) is nn.Linear


# --------------------------------------------------------------------------- through the backend


@pytest.fixture(scope="module")
def tiny_bundle():
    from unirl.models.sd3 import SD3Bundle

    torch.manual_seed(0)
    return SD3Bundle(
        path="tiny", dtype="fp32", text_encoder_dtype="fp32", device="cpu", max_sequence_length=32
    )


def _local_copy(bundle):
    local = copy.copy(bundle)
    local.transformer = copy.deepcopy(bundle.transformer)
    return local


def test_backend_refuses_fp8_for_a_full_fine_tune(tiny_bundle) -> None:
    with pytest.raises(ConfigError, match=r"fp8_frozen .* needs backend\.lora"):
        FSDPBackend(
            bundle=_local_copy(tiny_bundle),
            lora=None,
            fsdp={"fp8_frozen": True},
            param_dtype="fp32",
            device="cpu",
        )


@pytest.mark.parametrize("old_logp_source", ["replay", "rollout"])
def test_fp8_first_update_is_exactly_on_policy_on_tiny_sd3(tiny_bundle, old_logp_source) -> None:
    """Sampling and training share the FP8 base, so the first ratio is exactly 1."""
    from unirl.algorithms import FlowGRPO
    from unirl.models.sd3 import SD3Pipeline
    from unirl.sde import FlowSDE, sigmas_from_scheduler_config
    from unirl.train import TrainStack
    from unirl.types import DiffusionSamplingParams, RolloutReq, Texts

    local = _local_copy(tiny_bundle)
    backend = FSDPBackend(
        bundle=local,
        lora=LoraConfig(rank=4, alpha=8, targets=["to_q", "to_k", "to_v", "to_out.0"]),
        optimizer=OptimizerConfig(lr=1e-2),
        fsdp={"fp8_frozen": True},
        param_dtype="fp32",
        device="cpu",
    )
    assert any(n.endswith("attn.to_q.base_layer") for n in backend.fp8_linears)
    assert any(n.endswith("ff.net.2") for n in backend.fp8_linears)
    assert not any("norm" in n for n in backend.fp8_linears)
    pipeline = SD3Pipeline(bundle=local, strategy=FlowSDE(eta=0.7))
    algorithm = FlowGRPO(
        pipeline=pipeline, clip_range=1e-3, kl_beta=0.04, old_logp_source=old_logp_source
    )
    stack = TrainStack(backend=backend, algorithm=algorithm, micro_batch_size=4, shuffle=False)
    n = 4
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 2,
        primitives={"text": Texts(texts=["a red cat"] * 2 + ["a blue dog"] * 2)},
        sde_indices=torch.tensor([[1, 3]] * n),
        sampling_params=DiffusionSamplingParams(
            num_inference_steps=5, guidance_scale=4.5, height=64, width=64, samples_per_prompt=2
        ),
        sigmas=sigmas_from_scheduler_config(
            local.scheduler_config, 5, image_seq_len=local.image_seq_len(64, 64)
        ),
        init_noise_shape=local.latent_shape(64, 64),
        seed=3,
    )
    track = pipeline.generate(req).tracks["diffusion"]
    track = dataclasses.replace(track, rewards=torch.arange(n).float())
    track, _ = track.compute_advantages()
    step = stack.train_track(track, 0, 0.0)["steps"][0]
    assert step["ratio/min"] == 1.0 and step["ratio/max"] == 1.0, step
    assert step["old_logp/rollout_vs_replay_max"] == 0.0
    assert step["kl_loss"] == 0.0  # the adapter starts as identity: policy == FP8 reference
    assert step["grad_norm"] > 0
