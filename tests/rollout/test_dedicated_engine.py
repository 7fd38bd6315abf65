"""``DedicatedEngine`` on CPU: its own copy (not the trainer's tensors), sleep / wake keep the
outputs, generate refuses while asleep, construction errors name the field."""

from __future__ import annotations

import pytest
import torch
from rollout_fakes import BUNDLE_BLOCK, PIPELINE_BLOCK, make_request

from unirl.config import ConfigError
from unirl.rollout import DedicatedEngine


@pytest.fixture(scope="module")
def engine() -> DedicatedEngine:
    return DedicatedEngine(bundle=dict(BUNDLE_BLOCK), pipeline=dict(PIPELINE_BLOCK), device="cpu")


def test_defaults_and_own_copy(engine: DedicatedEngine) -> None:
    info = engine.describe()
    assert info["dtype"] == "torch.float32" and info["device"] == "cpu"  # fp32 default on CPU
    assert engine.pipeline.bundle is engine.bundle and info["engine_bytes"] > 0
    other = DedicatedEngine(
        bundle=dict(BUNDLE_BLOCK), pipeline=dict(PIPELINE_BLOCK), dtype="bf16", device="cpu"
    )
    p = next(other.bundle.transformer.parameters())
    assert (
        p.dtype == torch.bfloat16
        and p.data_ptr() != next(engine.bundle.transformer.parameters()).data_ptr()
    )


def test_sleep_wake_keeps_outputs(engine: DedicatedEngine) -> None:
    req = make_request(engine.bundle.scheduler_config, engine.bundle.latent_shape(64, 64), spp=1)
    before = engine.generate(req).tracks["diffusion"]
    slept = engine.sleep()
    assert slept["engine_bytes"] == slept["freed_bytes"] > 0  # CPU: the bytes a GPU run would free
    with pytest.raises(RuntimeError, match="while asleep"):
        engine.generate(req)
    assert engine.sleep()["freed_bytes"] == 0.0  # idempotent
    engine.wake_up()
    after = engine.generate(req).tracks["diffusion"]
    assert torch.equal(before.segment.sde_logp, after.segment.sde_logp)
    assert torch.equal(before.decoded.pixels, after.decoded.pixels)


def test_construction_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.device must be cpu, cuda or auto"):
        DedicatedEngine(bundle=dict(BUNDLE_BLOCK), pipeline=dict(PIPELINE_BLOCK), device="tpu")
    with pytest.raises(ConfigError, match=r"rollout\.pipeline must be a block"):
        DedicatedEngine(bundle=dict(BUNDLE_BLOCK), pipeline=object())
    with pytest.raises(ConfigError, match=r"rollout\.dtype: unknown precision"):
        DedicatedEngine(bundle=dict(BUNDLE_BLOCK), pipeline=dict(PIPELINE_BLOCK), dtype="fp8x")
