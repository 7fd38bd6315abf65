"""flow_match_sigmas equals diffusers' FlowMatchEulerDiscreteScheduler sigmas bit-for-bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

from unirl.sde import (
    dynamic_shift_mu,
    flow_match_sigmas,
    sigmas_from_scheduler_config,
    timesteps_from_sigmas,
)

SD35 = {"shift": 3.0}
FLUX = {
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}


def _diffusers(config: dict, steps: int, **kwargs) -> FlowMatchEulerDiscreteScheduler:
    scheduler = FlowMatchEulerDiscreteScheduler(**config)
    scheduler.set_timesteps(steps, **kwargs)
    return scheduler


@pytest.mark.parametrize("steps", [10, 40, 1, 28])
@pytest.mark.parametrize(
    "config",
    [
        SD35,
        {},
        {"shift": 1.7, "num_train_timesteps": 500},
        {"shift": 3.0, "shift_terminal": 0.1},
        {"shift": 3.0, "invert_sigmas": True},
    ],
    ids=["sd35", "default", "shift1.7-500", "terminal", "inverted"],
)
def test_static_shift_matches_diffusers(config, steps):
    if config.get("shift_terminal") and steps == 1:
        with pytest.raises(ValueError, match="shift_terminal"):
            flow_match_sigmas(steps, **config)
        return
    scheduler = _diffusers(config, steps)
    ours = flow_match_sigmas(steps, **config)
    assert ours.dtype == torch.float32 and ours.shape == (steps + 1,)
    assert torch.equal(ours, scheduler.sigmas)
    assert torch.equal(
        timesteps_from_sigmas(ours, config.get("num_train_timesteps", 1000)), scheduler.timesteps
    )
    assert torch.equal(
        sigmas_from_scheduler_config(dict(scheduler.config), steps), scheduler.sigmas
    )


@pytest.mark.parametrize("steps", [10, 40, 1])
@pytest.mark.parametrize("image_seq_len", [256, 1024, 4096])
def test_dynamic_shift_matches_diffusers(steps, image_seq_len):
    mu = calculate_shift(image_seq_len, 256, 4096, 0.5, 1.15)
    assert dynamic_shift_mu(image_seq_len) == mu
    scheduler = _diffusers(FLUX, steps, mu=mu)
    assert torch.equal(
        flow_match_sigmas(steps, **FLUX, image_seq_len=image_seq_len), scheduler.sigmas
    )
    assert torch.equal(flow_match_sigmas(steps, **FLUX, mu=mu), scheduler.sigmas)
    from_config = sigmas_from_scheduler_config(dict(scheduler.config), steps, image_seq_len)
    assert torch.equal(from_config, scheduler.sigmas)


@pytest.mark.parametrize("steps", [10, 28])
def test_flux_custom_sigmas_and_linear_shift_match_diffusers(steps):
    base = np.linspace(1.0, 1 / steps, steps)
    scheduler = _diffusers(FLUX, steps, mu=0.9, sigmas=base)
    ours = flow_match_sigmas(steps, **FLUX, mu=0.9, base_sigmas=base)
    assert torch.equal(ours, scheduler.sigmas)
    linear = {**FLUX, "time_shift_type": "linear"}
    scheduler = _diffusers(linear, steps, mu=1.3)
    assert torch.equal(flow_match_sigmas(steps, **linear, mu=1.3), scheduler.sigmas)
    static = _diffusers(SD35, steps, sigmas=base)
    assert torch.equal(flow_match_sigmas(steps, **SD35, base_sigmas=base), static.sigmas)


def test_sd35_schedule_values():
    sigmas = flow_match_sigmas(10, shift=3.0)
    assert sigmas[0].item() == 1.0 and sigmas[-1].item() == 0.0
    assert bool((sigmas[1:] < sigmas[:-1]).all())


def test_config_errors():
    with pytest.raises(ValueError, match="use_karras_sigmas"):
        sigmas_from_scheduler_config({"shift": 3.0, "use_karras_sigmas": True}, 10)
    with pytest.raises(ValueError, match="stochastic_sampling"):
        sigmas_from_scheduler_config({"stochastic_sampling": True}, 10)
    with pytest.raises(ValueError, match="FlowMatchEulerDiscreteScheduler only"):
        sigmas_from_scheduler_config({"_class_name": "FlowMatchHeunDiscreteScheduler"}, 10)
    with pytest.raises(ValueError, match="mu or image_seq_len"):
        sigmas_from_scheduler_config(FLUX, 10)
    with pytest.raises(ValueError, match="num_inference_steps"):
        flow_match_sigmas(0)
    with pytest.raises(ValueError, match="base_sigmas"):
        flow_match_sigmas(4, base_sigmas=[1.0, 0.5])
    # Unknown / bookkeeping keys are ignored.
    ignored = {"shift": 3.0, "_diffusers_version": "0.42.1", "some_future_key": 7}
    assert torch.equal(sigmas_from_scheduler_config(ignored, 10), flow_match_sigmas(10, shift=3.0))
