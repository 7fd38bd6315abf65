"""Fused q / k / v projections (``bundle.fuse_projections``) against diffusers' processor, with
and without LoRA, through every adapter switch the algorithms use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from unirl.models.common.fused_linear import _FrozenBaseLinear, fused_projections
from unirl.models.sd3.attention import FusedJointAttnProcessor, install_fused_attention
from unirl.models.sd3.conditions import SD3Conditions
from unirl.train.lora import (
    LoraConfig,
    adapter_active,
    adapter_parameter_names,
    adapters_disabled,
    add_frozen_adapter,
    inject_lora,
)


def _lora_bundle(make: Callable[..., Any], *, fuse: bool, dropout: float = 0.0, **kw: Any) -> Any:
    """A tiny bundle with a LoRA whose B is non-zero (so the adapter changes the output)."""
    bundle = make(fuse_projections=fuse, **kw)
    cfg = LoraConfig(rank=4, alpha=8, dropout=dropout)
    inject_lora(bundle.transformer, cfg, bundle.lora_default_targets, seed=3)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in bundle.transformer.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            if ".lora_" in name:
                p.data = p.data.float()  # fp32 masters, as the backend keeps them
    return bundle


def _inputs(bundle: Any, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor, SD3Conditions]:
    gen = torch.Generator().manual_seed(11)
    tcfg = bundle.transformer.config
    latents = torch.randn(rows, tcfg.in_channels, 8, 8, generator=gen)
    sigma = torch.tensor([0.7, 0.3][:rows])
    cond = SD3Conditions(
        prompt_embeds=torch.randn(rows, 12, tcfg.joint_attention_dim, generator=gen),
        pooled_prompt_embeds=torch.randn(rows, tcfg.pooled_projection_dim, generator=gen),
    )
    return latents, sigma, cond


def _lora_grads(bundle: Any) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.clone()
        for n, p in bundle.transformer.named_parameters()
        if n in set(adapter_parameter_names(bundle.transformer, "default"))
    }


def _assert_close_dicts(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float
) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name, **tol)


def test_fused_processor_is_installed_on_every_attention(make_tiny_sd3: Callable[..., Any]) -> None:
    fused = make_tiny_sd3()
    plain = make_tiny_sd3(fuse_projections=False)
    attns = [m for m in fused.transformer.modules() if hasattr(m, "processor")]
    # the tiny preset: 2 joint attentions + 1 MMDiT-X second attention
    assert len(attns) == 3
    assert all(isinstance(m.processor, FusedJointAttnProcessor) for m in attns)
    assert not any(
        isinstance(m.processor, FusedJointAttnProcessor)
        for m in plain.transformer.modules()
        if hasattr(m, "processor")
    )
    with pytest.raises(ValueError, match="fuse_projections=false"):
        install_fused_attention(nn.Sequential(nn.Linear(2, 2)))


def test_fused_forward_and_lora_grads_match_diffusers_processor(
    make_tiny_sd3: Callable[..., Any],
) -> None:
    fused, plain = (_lora_bundle(make_tiny_sd3, fuse=f) for f in (True, False))
    latents, sigma, cond = _inputs(fused)
    outs = []
    for bundle in (fused, plain):
        v = bundle.predict_velocity(latents, sigma, cond)
        (v * torch.linspace(-1, 1, v.numel()).reshape(v.shape)).sum().backward()
        outs.append(v.detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    _assert_close_dicts(_lora_grads(fused), _lora_grads(plain), rtol=1e-4, atol=1e-6)
    # the frozen base got no gradient through the fused path
    assert all(p.grad is None for n, p in fused.transformer.named_parameters() if ".lora_" not in n)
    # the adapter matters, and switching it off gives the base model in both paths
    with torch.no_grad():
        base = [b.predict_velocity(latents, sigma, cond) for b in (fused, plain)]
        with adapters_disabled(fused.transformer), adapters_disabled(plain.transformer):
            off = [b.predict_velocity(latents, sigma, cond) for b in (fused, plain)]
    torch.testing.assert_close(off[0], off[1], rtol=1e-5, atol=1e-5)
    assert (base[0] - off[0]).abs().max() > 1e-3


def test_fused_path_follows_the_active_adapter(make_tiny_sd3: Callable[..., Any]) -> None:
    fused, plain = (_lora_bundle(make_tiny_sd3, fuse=f) for f in (True, False))
    for bundle in (fused, plain):
        cfg = LoraConfig(rank=4, alpha=8)
        targets = bundle.lora_default_targets
        add_frozen_adapter(bundle.transformer, cfg, targets, "old", copy_from="default")
        with torch.no_grad():  # make "old" differ from "default"
            for name, p in bundle.transformer.named_parameters():
                if ".lora_B.old." in name:
                    p.mul_(-2.0)
    latents, sigma, cond = _inputs(fused)
    with torch.no_grad():
        with adapter_active(fused.transformer, "old"), adapter_active(plain.transformer, "old"):
            old = [b.predict_velocity(latents, sigma, cond) for b in (fused, plain)]
        default = [b.predict_velocity(latents, sigma, cond) for b in (fused, plain)]
    torch.testing.assert_close(old[0], old[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(default[0], default[1], rtol=1e-5, atol=1e-5)
    assert (old[0] - default[0]).abs().max() > 1e-3


def test_active_lora_dropout_is_drawn_as_peft_draws_it(make_tiny_sd3: Callable[..., Any]) -> None:
    fused, plain = (_lora_bundle(make_tiny_sd3, fuse=f, dropout=0.5) for f in (True, False))
    latents, sigma, cond = _inputs(fused)
    outs = []
    for bundle in (fused, plain):
        bundle.transformer.train()
        torch.manual_seed(0)
        v = bundle.predict_velocity(latents, sigma, cond)
        v.square().mean().backward()
        outs.append(v.detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    _assert_close_dicts(_lora_grads(fused), _lora_grads(plain), rtol=1e-4, atol=1e-6)


def test_bf16_base_with_fp32_adapter_matches_peft_without_autocast(
    make_tiny_sd3: Callable[..., Any],
) -> None:
    # outside autocast peft runs an fp32 adapter in fp32 beside the bf16 base; so must we.
    # The fused path rounds the matmul to bf16 before adding the bias (diffusers' addmm
    # rounds once), so outputs of magnitude ~1 agree within a couple of bf16 ulps (2^-7).
    fused, plain = (_lora_bundle(make_tiny_sd3, fuse=f, dtype="bf16") for f in (True, False))
    latents, sigma, cond = _inputs(fused)
    with torch.no_grad():
        v = [b.predict_velocity(latents, sigma, cond) for b in (fused, plain)]
    torch.testing.assert_close(v[0], v[1], rtol=0.0, atol=2e-2)
    assert (v[0] - v[1]).abs().mean() < 1e-3


def test_frozen_base_linear_gradients_in_float64() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w1 = torch.randn(7, 6, dtype=torch.float64, generator=gen)
    w2 = torch.randn(2, 6, dtype=torch.float64, generator=gen)
    a = torch.randn(3, 6, dtype=torch.float64, generator=gen, requires_grad=True)

    def fn(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return _FrozenBaseLinear.apply(x, a, torch.float64, w1, w2)

    assert torch.autograd.gradcheck(fn, (x, a))
    out = fn(x, a)
    torch.testing.assert_close(out, x @ torch.cat([w1, w2, a]).T, rtol=0.0, atol=1e-12)


def test_fused_projections_equal_the_layers_one_by_one() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(6, 4), nn.Linear(6, 5, bias=False), nn.Linear(6, 3)]
    x = torch.randn(3, 2, 6)
    for got, layer in zip(fused_projections(x, layers), layers, strict=True):
        torch.testing.assert_close(got, layer(x), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="fuse_projections=false"):
        fused_projections(x, [nn.Conv1d(6, 2, 1)])
