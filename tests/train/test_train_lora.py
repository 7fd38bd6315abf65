"""LoRA injection, precision, adapter switches and activation checkpointing of FSDPBackend."""

from __future__ import annotations

import pytest
import torch
from train_fakes import (
    TARGETS,
    TinyBundle,
    loss_of,
    make_backend,
    output,
    train_step,
    transformer_inputs,
)

from unirl.config import ConfigError
from unirl.train import FSDPConfig, LoraConfig


def test_lora_only_on_targets_base_frozen_and_fp32_master_over_bf16_base() -> None:
    bundle = TinyBundle()
    backend = make_backend(bundle=bundle, param_dtype="bf16")
    assert bundle.transformer is backend.module  # set back on the bundle
    names = [n for n, _ in backend.named_trainable_parameters()]
    # 2 blocks x (attn: 4 targets + attn context projections: none targeted) x (A, B)
    assert len(names) == 2 * len(TARGETS) * 2
    for name, p in backend.module.named_parameters():
        is_lora = ".lora_A.default." in name or ".lora_B.default." in name
        assert p.requires_grad == is_lora, name
        assert p.dtype == (torch.float32 if is_lora else torch.bfloat16), name
        if is_lora:
            layer = name.split(".lora_")[0]
            assert any(layer.endswith("." + t) for t in TARGETS), name
    for name, b in backend.module.named_buffers():
        if b.is_floating_point():
            assert b.dtype == torch.bfloat16, name
    rank = 4
    expected = sum(
        rank * (m.in_features + m.out_features)
        for n, m in TinyBundle().transformer.named_modules()  # a fresh, un-injected copy
        if isinstance(m, torch.nn.Linear) and any(n.endswith("." + t) for t in TARGETS)
    )
    assert backend.num_trainable_params() == expected
    assert {id(p) for p in backend.trainable_parameters()} == {
        id(p) for g in backend.optimizer.param_groups for p in g["params"]
    }
    # bf16 base + fp32 LoRA runs forward and backward, grads land on the fp32 master.
    inputs = transformer_inputs(2, dtype=torch.bfloat16)
    loss_of(backend, inputs).backward()
    grads = [p.grad for p in backend.trainable_parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)


def test_unmatched_target_error_lists_it_and_available_names() -> None:
    with pytest.raises(ConfigError) as err:
        make_backend(lora=LoraConfig(rank=2, targets=["to_q", "nope_proj"]))
    msg = str(err.value)
    assert "['nope_proj']" in msg
    assert "to_k" in msg and "to_out.0" in msg  # available layer names are listed


def test_lora_init_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a = make_backend(seed=3).full_trainable_state()
    assert torch.equal(torch.get_rng_state(), state)
    b = make_backend(seed=3).full_trainable_state()
    c = make_backend(seed=4).full_trainable_state()
    lora_a = [n for n in a if ".lora_A." in n]
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not any(torch.equal(a[n], c[n]) for n in lora_a)
    assert all(float(a[n].abs().max()) == 0.0 for n in a if ".lora_B." in n)  # starts at identity


def test_adapter_disabled_is_the_base_and_training_moves_the_adapter() -> None:
    inputs = transformer_inputs(2)
    reference = TinyBundle()
    with torch.no_grad():
        plain = reference.transformer(**inputs).sample  # same weights, never injected
    backend = make_backend()
    with backend.adapter_disabled():
        base = output(backend, inputs)
    # peft's wrapper and the plain module agree to ~1 ulp (CPU SDPA), not bitwise.
    assert torch.allclose(base, plain, atol=1e-6, rtol=0)
    assert torch.equal(output(backend, inputs), base)  # B = 0: identity at init
    flags = [p.requires_grad for p in backend.module.parameters()]
    train_step(backend, inputs)
    with backend.adapter_disabled():
        disabled = output(backend, inputs)
    enabled = output(backend, inputs)
    assert torch.equal(disabled, base)  # exactly the frozen base after a step
    assert float((enabled - base).abs().max()) > 1e-4
    assert [p.requires_grad for p in backend.module.parameters()] == flags  # switches restore flags


def test_extra_adapter_is_a_frozen_copy_switchable_and_syncable() -> None:
    inputs = transformer_inputs(2)
    backend = make_backend(
        lora=LoraConfig(rank=4, alpha=8.0, targets=list(TARGETS), extra_adapters=["old"])
    )
    assert backend.adapters == ["default", "old"]
    trainable = {n for n, _ in backend.named_trainable_parameters()}
    assert trainable and all(".default." in n for n in trainable)
    named = dict(backend.module.named_parameters())
    old_names = [n for n in named if ".old." in n]
    assert len(old_names) == len(trainable)
    for n in old_names:
        assert not named[n].requires_grad and named[n].dtype == torch.float32
        assert torch.equal(named[n], named[n.replace(".old.", ".default.")])  # a copy

    train_step(backend, inputs)
    default_out = output(backend, inputs)
    with backend.set_active_adapter("old"):
        old_out = output(backend, inputs)
        assert [n for n, p in backend.module.named_parameters() if p.requires_grad] == sorted(
            trainable, key=list(named).index
        )
    with backend.adapter_disabled():
        base_out = output(backend, inputs)
    assert torch.equal(old_out, base_out)  # "old" is still the init copy (identity)
    assert not torch.equal(default_out, old_out)
    assert torch.equal(output(backend, inputs), default_out)  # switch restored

    # EMA-style blend, then a plain copy.
    before = {n: named[n].detach().clone() for n in old_names}
    backend.sync_adapter("old", decay=0.25)
    for n in old_names:
        src = named[n.replace(".old.", ".default.")].detach()
        assert torch.allclose(named[n], 0.25 * before[n] + 0.75 * src, atol=1e-7, rtol=0)
    backend.sync_adapter("old")
    with backend.set_active_adapter("old"):
        assert torch.equal(output(backend, inputs), default_out)

    backend.add_adapter("older", copy_from="old")
    assert backend.adapters == ["default", "old", "older"]
    assert {n for n, p in backend.module.named_parameters() if p.requires_grad} == trainable
    with backend.set_active_adapter("older"):
        assert torch.equal(output(backend, inputs), default_out)
    with pytest.raises(ConfigError, match="only frozen adapters"):
        backend.add_adapter("x", trainable=True)
    with (
        pytest.raises(ConfigError, match="not on the module"),
        backend.set_active_adapter("missing"),
    ):
        pass


def test_lora_switches_need_lora() -> None:
    backend = make_backend(lora=None)
    assert not backend.has_lora
    assert backend.num_trainable_params() == sum(p.numel() for p in backend.module.parameters())
    with pytest.raises(ConfigError, match="needs LoRA"), backend.adapter_disabled():
        pass
    with pytest.raises(ConfigError, match="needs LoRA"):
        backend.export_lora("/nonexistent")


def test_activation_checkpointing_same_grads_fewer_saved_tensors() -> None:
    inputs = transformer_inputs(2)

    def grads_and_saved(ac: bool) -> tuple[list[torch.Tensor], int]:
        backend = make_backend(fsdp=FSDPConfig(activation_checkpointing=ac))
        train_step(backend, inputs)  # B != 0 so every LoRA tensor gets a gradient below
        backend.zero_grad()
        saved = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal saved
            saved += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_of(backend, inputs)
        loss.backward()
        return [p.grad.clone() for p in backend.trainable_parameters()], saved

    plain, saved_plain = grads_and_saved(False)
    checkpointed, saved_ac = grads_and_saved(True)
    assert all(
        torch.allclose(a, b, atol=1e-7, rtol=1e-5) for a, b in zip(plain, checkpointed, strict=True)
    )
    assert saved_ac < saved_plain / 2  # the blocks keep only their inputs


def test_missing_block_class_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="JointTransformerBlock"):
        make_backend(
            fsdp=FSDPConfig(activation_checkpointing=True, block_class_names=["NoSuchBlock"])
        )


def test_cpu_offload_without_sharding_is_refused() -> None:
    with pytest.raises(ConfigError, match="offload"):
        make_backend(fsdp=FSDPConfig(cpu_offload=True))
