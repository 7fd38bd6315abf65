"""FP8 sampling matmuls (``unirl.models.common.fp8_linear``): error against fp32, where they
apply (no-grad forwards inside the context only), the LoRA branch, SD3's fused projections,
the weight cache, the refusals, and one tiny SD3 Flow-GRPO step whose rollout samples in FP8
while π_old is replayed in fp32 (first ratio exactly 1).

On CPU the installed torch runs ``torch._scaled_mm`` itself (no emulation); it equals the
float32 emulation ``(x_q·s_x) @ (W_q·s_w)^T`` rounded to bf16, asserted below.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import inject_adapter_in_model
from torch import nn

from unirl.config.require import ConfigError
from unirl.models.common import fp8_linear
from unirl.models.common.fp8_linear import fp8_sampling, quantize_rows, scaled_matmul
from unirl.models.common.fused_linear import fused_projections

CPU = torch.device("cpu")
# measured: relative Frobenius error of one rowwise-scaled e4m3 matmul against fp32 is 0.036
# for Gaussian x and W (K = 256); 0.05 bounds it with margin
FP8_REL_ERROR = 0.05


class _Block(nn.Module):
    """Token projections (3-D inputs) and one per-sample modulation (2-D input)."""

    def __init__(self) -> None:
        super().__init__()
        self.to_q = nn.Linear(64, 64)
        self.to_k = nn.Linear(64, 64)
        self.to_v = nn.Linear(64, 64, bias=False)
        self.modulation = nn.Linear(64, 128)
        self.odd = nn.Linear(64, 40)  # not a multiple of 16: stays in its precision


def _lora_block(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    block = _Block()
    block.requires_grad_(False)
    config = PeftLoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v"])
    block = inject_adapter_in_model(config, block)
    for name, p in block.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
            if "lora_B" in name:  # peft starts B at zero: make the branch visible
                nn.init.normal_(p, std=0.1)
    return block


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_scaled_mm_on_cpu_equals_the_emulation_and_error_is_bounded() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(200, 256), torch.randn(96, 256) * 0.05
    x_q, s_x = quantize_rows(x)
    w_q, s_w = quantize_rows(w)
    out = scaled_matmul(x_q, s_x, w_q, s_w.reshape(1, -1).contiguous())
    emulated = ((x_q.float() * s_x) @ (w_q.float() * s_w).t()).bfloat16()
    assert out.dtype == torch.bfloat16
    # same numerics up to accumulation order (one bf16 ulp at most)
    assert torch.allclose(out.float(), emulated.float(), rtol=2**-7, atol=1e-6)
    error = _rel(out, x @ w.t())
    assert 0.01 < error < FP8_REL_ERROR, error  # e4m3 is lossy, but by a few percent only


def test_frozen_base_runs_fp8_only_without_grad_and_inside_the_context() -> None:
    block = _lora_block()
    x = torch.randn(2, 24, 64)
    emb = torch.randn(2, 64)
    with torch.no_grad():
        ref_q, ref_mod, ref_odd = block.to_q(x), block.modulation(emb), block.odd(x)
    warns = pytest.warns(UserWarning, match=r"odd is \[40, 64\], not multiples of 16")
    with warns, fp8_sampling([block], CPU) as session:
        with torch.no_grad():
            q = block.to_q(x)
            assert session.matmuls == 1
            assert torch.equal(block.modulation(emb), ref_mod)  # per-sample: not FP8
            assert torch.equal(block.odd(x), ref_odd)  # refused shape: own precision
            assert session.matmuls == 1
        # grad enabled (a training forward): the bf16/fp32 path, bit for bit
        assert torch.equal(block.to_q(x), ref_q)
        assert session.matmuls == 1
        assert type(block.to_q.lora_A["default"]) is nn.Linear  # the LoRA layers stay
        assert type(block.to_q.base_layer) is fp8_linear.Fp8SamplingLinear
    assert not torch.equal(q, ref_q)
    assert _rel(q, ref_q) < FP8_REL_ERROR
    assert type(block.to_q.base_layer) is nn.Linear  # swapped back on exit
    with torch.no_grad():
        assert torch.equal(block.to_q(x), ref_q)  # and exactly as before


def test_lora_branch_is_computed_in_its_own_precision() -> None:
    block = _lora_block()
    x = torch.randn(2, 24, 64)
    layer = block.to_q
    with torch.no_grad():
        lora = layer.lora_B["default"](layer.lora_A["default"](x)) * layer.scaling["default"]
        with fp8_sampling([block], CPU):
            full = layer(x)
            base = layer.base_layer(x)
    assert torch.equal(full, base + lora)


def test_fused_projections_take_the_fp8_path_with_lora_beside() -> None:
    block = _lora_block()
    x = torch.randn(2, 24, 64)
    layers = (block.to_q, block.to_k, block.to_v)
    with torch.no_grad(), fp8_sampling([block], CPU) as session:
        fused = fused_projections(x, layers)
        assert session.matmuls == 1  # one FP8 matmul over the concatenated weights
        separate = [layer(x) for layer in layers]
        assert session.matmuls == 4
    with torch.no_grad():
        exact = [layer(x) for layer in layers]
    for f, s, e in zip(fused, separate, exact, strict=True):
        # same quantized operands; only the accumulation order and bf16 rounding differ
        assert torch.allclose(f, s, rtol=2**-7, atol=1e-5)
        assert _rel(f, e) < FP8_REL_ERROR
    with fp8_sampling([block], CPU) as session:  # with grad: the fused bf16/fp32 path
        again = fused_projections(x, layers)
        assert session.matmuls == 0
    with torch.no_grad():
        plain = fused_projections(x, layers)
    assert all(torch.equal(a.detach(), p) for a, p in zip(again, plain, strict=True))


def test_weight_cache_requantizes_when_the_weight_changes() -> None:
    block = _lora_block()
    x = torch.randn(1, 8, 64)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # `odd`'s shape warning
        with fp8_sampling([block], CPU) as session:
            assert session.quantized == 4  # to_q / to_k / to_v bases, modulation: on entry
            first = block.to_q(x)
            block.to_q(x)
            assert session.quantized == 4  # kept on the layer
            block.to_q.base_layer.weight.mul_(2.0)  # in place: _version moves
            second = block.to_q(x)
            assert session.quantized == 5
            block.to_q.base_layer.weight.data = block.to_q.base_layer.weight.data.clone()
            block.to_q(x)
            assert session.quantized == 6  # new storage
            fused_projections(x, (block.to_q, block.to_k, block.to_v))
            block.to_k.base_layer.weight.mul_(0.5)  # a fused group's member changes
            fused = fused_projections(x, (block.to_q, block.to_k, block.to_v))
            assert session.quantized == 7
            assert torch.allclose(fused[1], block.to_k(x), rtol=2**-7, atol=1e-5)
        assert not hasattr(block.to_q.base_layer, "fp8_weight")  # removed on exit
        with fp8_sampling([block], CPU):  # a weight changed between contexts: re-quantized
            third = block.to_q(x)
    assert not torch.equal(first, second)
    assert torch.equal(third, second)


def test_refusals() -> None:
    trained = nn.Sequential(nn.Linear(32, 32))  # full fine-tuning: no frozen base
    refused = pytest.raises(RuntimeError, match=r"found no frozen nn\.Linear.*fp8_sampling=false")
    with refused, fp8_sampling([trained], CPU):
        pass
    block = _lora_block()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = pytest.raises(RuntimeError, match="does not nest")
        with fp8_sampling([block], CPU), nested, fp8_sampling([block], CPU):
            pass


def test_old_cuda_devices_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "A100")
    problem = fp8_linear.fp8_device_problem(torch.device("cuda", 0))
    assert problem is not None and "compute capability 8.0" in problem
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8_linear.fp8_device_problem(torch.device("cuda", 0)) is None


def test_bundle_refuses_an_unsupported_device_before_loading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from unirl.models.common import bundle as bundle_module
    from unirl.models.sd3 import SD3Bundle

    monkeypatch.setattr(bundle_module, "fp8_device_problem", lambda device: "an old card")

    def no_load(self: object) -> None:
        raise AssertionError("loaded weights before refusing")

    monkeypatch.setattr(SD3Bundle, "load", no_load)
    with pytest.raises(ConfigError, match=r"bundle\.fp8_sampling=true: an old card"):
        SD3Bundle(path="tiny", device="cpu", fp8_sampling=True)


def test_sd3_rollout_samples_fp8_and_the_first_ratio_is_exactly_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import test_family_sd3 as sd3_family

    from unirl.algorithms import FlowGRPO
    from unirl.sde import FlowSDE
    from unirl.train import FSDPBackend, LoraConfig, OptimizerConfig, TrainStack

    calls = {"fp8": 0}
    real = fp8_linear.scaled_matmul

    def counted(*args: torch.Tensor) -> torch.Tensor:
        assert not torch.is_grad_enabled()
        calls["fp8"] += 1
        return real(*args)

    monkeypatch.setattr(fp8_linear, "scaled_matmul", counted)
    family = sd3_family.TestSD3Family()
    bundle = family.make_bundle(fp8_sampling=True)
    backend = FSDPBackend(
        bundle=bundle,
        lora=LoraConfig(rank=4, alpha=8, targets=["to_q", "to_k", "to_v", "to_out.0"]),
        optimizer=OptimizerConfig(lr=2e-2),
        param_dtype="fp32",
        device="cpu",
    )
    pipeline = family.pipeline_class(bundle=bundle, strategy=FlowSDE(eta=0.7))
    algorithm = FlowGRPO(
        pipeline=pipeline, clip_range=1e-3, old_logp_source="replay", cfg_gradient="both"
    )
    stack = TrainStack(
        backend=backend, algorithm=algorithm, micro_batch_size=8, num_updates_per_batch=1
    )
    req = family.request(bundle, samples_per_prompt=4, sde_steps=(0, 1, 2), guidance_scale=4.5)
    track = pipeline.generate(req).tracks["diffusion"]
    sampled = calls["fp8"]
    assert sampled > 0  # the rollout's transformer matmuls ran in FP8
    track = dataclasses.replace(track, rewards=torch.arange(len(track)).float())
    track, _ = track.compute_advantages()
    step = stack.train_track(track, 0)["steps"][0]
    assert calls["fp8"] == sampled  # neither the π_old replay nor the loss forward did
    assert step["ratio/min"] == 1.0 and step["ratio/max"] == 1.0, step
    # the sampler's log-probs were FP8's, the replayed π_old the fp32 policy's
    assert step["old_logp/rollout_vs_replay_max"] > 0
    assert step["grad_norm"] > 0


class _CompiledBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 128)
        self.b = nn.Linear(128, 64)
        self.q, self.k, self.v = (nn.Linear(64, 64, bias=i != 2) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(torch.relu(self.a(x)))
        q, k, v = fused_projections(h, (self.q, self.k, self.v))
        return h + q * k + v


def test_compiled_fp8_forward_has_no_graph_break_and_does_not_recompile_per_rollout() -> None:
    """Four blocks compiled per block (``compile(dynamic=False)``, as the bundles do) sampled in
    three successive contexts. Measured (torch 2.13, CPU): 1 graph outside the context and 1
    FP8 graph in the first context, shared by all four blocks, 0 new in the second and third,
    and no graph break. The fused q / k / v weight cached on a block's first layer, which this
    replaced, put that layer's weight fingerprint into the guards: one more graph per block
    (SD3.5-M: 24 blocks) until dynamo's recompile limit (8), then eager (measured here: [1, 8,
    8, 8]; on the GPU a first FP8 rollout that had not ended after 223 s)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    blocks = nn.ModuleList(_CompiledBlock() for _ in range(4)).requires_grad_(False)
    x = torch.randn(2, 32, 64)

    def forward() -> torch.Tensor:
        h = x
        for block in blocks:
            h = block(h) * 0.1
        return h

    with torch.no_grad(), fp8_sampling([blocks], CPU):
        eager = [forward(), forward()]
    for block in blocks:
        block.compile(dynamic=False)
    with torch.no_grad():
        plain = forward()
    graphs = [counters["stats"]["unique_graphs"]]
    outs = []
    for _ in range(3):
        with torch.no_grad(), fp8_sampling([blocks], CPU):
            outs.append([forward(), forward()])
        with torch.no_grad():
            assert torch.equal(forward(), plain)  # back to the plain layers
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1, 2, 2, 2], graphs
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    for rollout in outs:
        for got, ref in zip(rollout, eager, strict=True):
            # compiled vs eager FP8 forward: the same quantized operands, a few bf16 ulps apart
            # after four blocks
            assert torch.allclose(got, ref, rtol=2**-6, atol=1e-5)
    torch._dynamo.reset()
