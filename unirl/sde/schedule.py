"""Flow-matching σ schedules, bit-identical to diffusers' ``FlowMatchEulerDiscreteScheduler``.

``flow_match_sigmas`` reproduces ``FlowMatchEulerDiscreteScheduler(**config).set_timesteps(n,
mu=..., sigmas=...).sigmas`` without importing diffusers: the same float32 training table, the
same float64 ``linspace`` of timesteps, the same shift and the same final float32 cast
(checked against diffusers 0.42 in ``tests/sde/test_schedule.py``).

The one σ policy (``sigmas_from_scheduler_config``) reads a family's scheduler config. Beside
diffusers' own keys it reads ``sigma_spacing``, the pre-shift σ a family's diffusers pipeline
hands the scheduler: ``scheduler`` (the default: the scheduler's own spacing, as SD3's
pipeline uses), ``linspace`` (``linspace(1, 1/T, T)``, passed as ``sigmas=`` by the
Qwen-Image and FLUX pipelines) or ``linspace_fp32`` (the same σ from a float32
``torch.linspace``, as the Z-Image pipeline computes them). With dynamic shifting, μ comes from the image token count;
``mu_policy`` says how: ``linear`` (the default: ``dynamic_shift_mu`` over the config's base /
max shift) or ``flux2_empirical`` (``flux2_empirical_mu``: FLUX.2's fit in the image token
count *and* the step count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

# Scheduler-config keys that change the sigmas in ways this module does not reproduce.
_UNSUPPORTED_FLAGS = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")
# ``sigma_spacing`` values: the pre-shift σ of a family's diffusers pipeline.
SIGMA_SPACINGS = ("scheduler", "linspace", "linspace_fp32")
# ``mu_policy`` values: how a dynamic shift's μ is chosen when the caller passes none.
MU_POLICIES = ("linear", "flux2_empirical")
# FLUX.2's μ fits (slope per image token, intercept) at 10 and at 200 denoising steps.
_FLUX2_MU_AT_10_STEPS = (8.73809524e-05, 1.89833333)
_FLUX2_MU_AT_200_STEPS = (0.00016927, 0.45666666)
# Above this many image tokens FLUX.2 uses the 200-step fit whatever the step count.
_FLUX2_MU_LARGE_IMAGE = 4300


def linspace_base_sigmas(num_inference_steps: int) -> np.ndarray:
    """``linspace(1, 1/T, T)`` in float64: the pre-shift σ the Qwen-Image and FLUX pipelines
    pass to the scheduler (``set_timesteps(sigmas=...)``)."""
    return np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)


def linspace_fp32_base_sigmas(num_inference_steps: int) -> np.ndarray:
    """``linspace(1, 1/T, T)`` computed in float32 by ``torch.linspace`` (the Z-Image
    pipeline's pre-shift σ), widened to float64 without changing a value."""
    steps = torch.linspace(1.0, 1 / num_inference_steps, num_inference_steps, dtype=torch.float32)
    return steps.double().numpy()


def dynamic_shift_mu(
    image_seq_len: int,
    *,
    base_image_seq_len: int = 256,
    max_image_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """Resolution-dependent shift μ, linear in the latent token count (diffusers pipelines'
    ``calculate_shift``, same operation order so the float result is identical)."""
    slope = (max_shift - base_shift) / (max_image_seq_len - base_image_seq_len)
    intercept = base_shift - slope * base_image_seq_len
    return image_seq_len * slope + intercept


def flux2_empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """μ of the FLUX.2 pipelines (``compute_empirical_mu``): two linear fits in the image
    token count, one for 10 steps and one for 200, interpolated linearly in ``num_steps``
    (extrapolated outside [10, 200]); above 4300 tokens the 200-step fit alone. Same float
    operations in the same order, so the σ that follow are bit-identical."""
    slope_200, intercept_200 = _FLUX2_MU_AT_200_STEPS
    at_200 = slope_200 * image_seq_len + intercept_200
    if image_seq_len > _FLUX2_MU_LARGE_IMAGE:
        return float(at_200)
    slope_10, intercept_10 = _FLUX2_MU_AT_10_STEPS
    at_10 = slope_10 * image_seq_len + intercept_10
    per_step = (at_200 - at_10) / 190.0
    return float(per_step * num_steps + (at_200 - 200.0 * per_step))


def _training_sigma_range(
    num_train_timesteps: int, shift: float, shifted: bool
) -> tuple[float, float]:
    """(σ_max, σ_min) of diffusers' fp32 training table (shifted unless dynamic shifting)."""
    table = np.linspace(1, num_train_timesteps, num_train_timesteps, dtype=np.float32)[::-1].copy()
    sig = torch.from_numpy(table).to(torch.float32) / num_train_timesteps
    if shifted:
        sig = shift * sig / (1 + (shift - 1) * sig)
    return sig[0].item(), sig[-1].item()


def flow_match_sigmas(
    num_inference_steps: int,
    *,
    shift: float = 1.0,
    use_dynamic_shifting: bool = False,
    base_shift: float | None = 0.5,
    max_shift: float | None = 1.15,
    base_image_seq_len: int = 256,
    max_image_seq_len: int = 4096,
    image_seq_len: int | None = None,
    mu: float | None = None,
    num_train_timesteps: int = 1000,
    invert_sigmas: bool = False,
    shift_terminal: float | None = None,
    time_shift_type: Literal["exponential", "linear"] = "exponential",
    base_sigmas: Sequence[float] | None = None,
) -> Tensor:
    """Returns ``sigmas[T + 1]`` fp32 (CPU), decreasing from ≈1 and ending with 0 (1 when
    ``invert_sigmas``), equal to diffusers' ``scheduler.sigmas`` after ``set_timesteps``.

    With ``use_dynamic_shifting`` the shift is μ = ``mu`` if given, else
    ``dynamic_shift_mu(image_seq_len, ...)`` (what the SD3 / Flux pipelines pass).
    ``base_sigmas`` are custom pre-shift sigmas (``set_timesteps(sigmas=...)``; the Flux
    pipeline passes ``linspace(1, 1/T, T)``).
    """
    if num_inference_steps < 1:
        raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    if time_shift_type not in ("exponential", "linear"):
        raise ValueError(
            f"time_shift_type must be 'exponential' or 'linear', got {time_shift_type!r}"
        )
    if use_dynamic_shifting and mu is None:
        if image_seq_len is None:
            raise ValueError(
                "use_dynamic_shifting=True needs mu or image_seq_len (latent tokens = "
                "(H/vae_scale/patch)·(W/vae_scale/patch))"
            )
        if base_shift is None or max_shift is None:
            raise ValueError("use_dynamic_shifting=True needs base_shift and max_shift to be set")
        mu = dynamic_shift_mu(
            image_seq_len,
            base_image_seq_len=base_image_seq_len,
            max_image_seq_len=max_image_seq_len,
            base_shift=base_shift,
            max_shift=max_shift,
        )

    if base_sigmas is None:
        sigma_max, sigma_min = _training_sigma_range(
            num_train_timesteps, shift, shifted=not use_dynamic_shifting
        )
        timesteps = np.linspace(
            sigma_max * num_train_timesteps, sigma_min * num_train_timesteps, num_inference_steps
        )
        sig = timesteps / num_train_timesteps
    else:
        sig = np.array(list(base_sigmas)).astype(np.float32)
        if len(sig) != num_inference_steps:
            raise ValueError(
                f"base_sigmas has {len(sig)} values but num_inference_steps={num_inference_steps}"
            )

    if use_dynamic_shifting:
        assert mu is not None
        scale = math.exp(mu) if time_shift_type == "exponential" else mu
        sig = scale / (scale + (1 / sig - 1))
    else:
        sig = shift * sig / (1 + (shift - 1) * sig)

    if shift_terminal:
        if num_inference_steps < 2:
            raise ValueError(
                "shift_terminal needs num_inference_steps >= 2 (diffusers divides 0 by 0 and "
                "returns NaN sigmas for a single step)"
            )
        one_minus = 1 - sig
        sig = 1 - one_minus / (one_minus[-1] / (1 - shift_terminal))

    out = torch.from_numpy(np.asarray(sig)).to(torch.float32)
    if invert_sigmas:
        return torch.cat([1.0 - out, torch.ones(1)])
    return torch.cat([out, torch.zeros(1)])


def sigmas_from_scheduler_config(
    config: Mapping[str, Any],
    num_inference_steps: int,
    image_seq_len: int | None = None,
    *,
    mu: float | None = None,
    base_sigmas: Sequence[float] | None = None,
) -> Tensor:
    """``flow_match_sigmas`` driven by a diffusers scheduler config dict (``scheduler_config.json``).

    Keys diffusers uses for these sigmas are read, and ``sigma_spacing`` and ``mu_policy``
    (see the module docstring); bookkeeping keys (``_class_name``, ``_diffusers_version``, ...) are ignored. Options this module does not reproduce
    (karras / exponential / beta sigmas, ``stochastic_sampling``) or another scheduler class
    raise ``ValueError``.
    """
    class_name = config.get("_class_name")
    if class_name is not None and class_name != "FlowMatchEulerDiscreteScheduler":
        raise ValueError(
            f"scheduler config is for {class_name}; UniRL sigma schedules reproduce "
            "FlowMatchEulerDiscreteScheduler only"
        )
    for flag in _UNSUPPORTED_FLAGS:
        if config.get(flag):
            raise ValueError(
                f"scheduler config sets {flag}=True, which UniRL's flow_match_sigmas does not "
                f"support; set {flag}=False (or drop it) in the scheduler config"
            )
    if config.get("stochastic_sampling"):
        raise ValueError(
            "scheduler config sets stochastic_sampling=True; UniRL replaces the scheduler step "
            "with its own kernels (unirl.sde), set stochastic_sampling=False"
        )
    spacing = config.get("sigma_spacing", "scheduler")
    if spacing not in SIGMA_SPACINGS:
        raise ValueError(
            f"scheduler config sets sigma_spacing={spacing!r}; use one of {SIGMA_SPACINGS}"
        )
    if spacing == "linspace" and base_sigmas is None:
        base_sigmas = linspace_base_sigmas(num_inference_steps).tolist()
    elif spacing == "linspace_fp32" and base_sigmas is None:
        base_sigmas = linspace_fp32_base_sigmas(num_inference_steps).tolist()
    mu_policy = config.get("mu_policy", "linear")
    if mu_policy not in MU_POLICIES:
        raise ValueError(f"scheduler config sets mu_policy={mu_policy!r}; use one of {MU_POLICIES}")
    if mu_policy == "flux2_empirical" and mu is None and config.get("use_dynamic_shifting"):
        if image_seq_len is None:
            raise ValueError(
                "mu_policy=flux2_empirical needs image_seq_len (latent tokens of the image)"
            )
        mu = flux2_empirical_mu(image_seq_len, num_inference_steps)
    shift_terminal = config.get("shift_terminal")
    return flow_match_sigmas(
        num_inference_steps,
        shift=float(config.get("shift", 1.0)),
        use_dynamic_shifting=bool(config.get("use_dynamic_shifting", False)),
        base_shift=config.get("base_shift", 0.5),
        max_shift=config.get("max_shift", 1.15),
        base_image_seq_len=int(config.get("base_image_seq_len", 256)),
        max_image_seq_len=int(config.get("max_image_seq_len", 4096)),
        image_seq_len=image_seq_len,
        mu=mu,
        num_train_timesteps=int(config.get("num_train_timesteps", 1000)),
        invert_sigmas=bool(config.get("invert_sigmas", False)),
        shift_terminal=None if shift_terminal is None else float(shift_terminal),
        time_shift_type=config.get("time_shift_type", "exponential"),
        base_sigmas=base_sigmas,
    )


def timesteps_from_sigmas(sigmas: Tensor, num_train_timesteps: int = 1000) -> Tensor:
    """Model timesteps ``[T]`` = ``sigmas[:-1] · num_train_timesteps`` (fp32), as diffusers sets
    ``scheduler.timesteps`` (for ``invert_sigmas`` schedules too)."""
    return sigmas[:-1].to(torch.float32) * num_train_timesteps
