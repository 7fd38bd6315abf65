"""Per-step kernels for flow-matching sampling: ``FlowSDE``, ``DanceSDE``, ``CPS`` and ``ODE``.

Every kernel maps (v, x, σ, σ') to a Gaussian step x' ~ N(μ, std²·I) (``ODE``: std = 0) and,
for the stochastic ones, the log-density of x' as a **mean** over the non-batch elements.
All step math runs in fp32 whatever the input dtypes. Formulas: ``docs/math.md``,
section "Per-step kernels".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import Tensor

from unirl.config import require

SigmaLike = float | Tensor
KLForm = Literal["gaussian", "reference"]
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(kw_only=True)
class StepOutput:
    """Result of one kernel step.

    ``next_latents[B, ...]`` (``storage_dtype`` when given, else fp32), ``log_prob[B]`` fp32
    (mean over all non-batch elements; ``None`` for deterministic kernels), ``mean[B, ...]``
    fp32 and ``std[B]`` fp32 (the per-sample Gaussian std of the step).
    """

    next_latents: Tensor
    log_prob: Tensor | None
    mean: Tensor
    std: Tensor


def _per_sample(value: SigmaLike, batch: int, device: torch.device) -> Tensor:
    """Turn a python float / 0-d / [1] / [B] sigma into an fp32 ``[B]`` tensor on ``device``."""
    if not isinstance(value, Tensor):
        return torch.full((batch,), float(value), dtype=torch.float32, device=device)
    t = value.to(device=device, dtype=torch.float32)
    if t.ndim == 0 or t.numel() == 1:
        return t.reshape(1).expand(batch)
    if t.ndim != 1 or t.shape[0] != batch:
        raise ValueError(
            f"sigma tensors must be 0-d or [B] with B={batch}; got shape {tuple(value.shape)}"
        )
    return t


def _as_tensor(value: SigmaLike, device: torch.device | None) -> Tensor:
    if isinstance(value, Tensor):
        return value.to(dtype=torch.float32, device=device or value.device)
    return torch.tensor(float(value), dtype=torch.float32, device=device)


def _host_values(value: SigmaLike) -> list[float] | None:
    """Values readable without a device sync (python numbers, CPU tensors), else ``None``."""
    if not isinstance(value, Tensor):
        return [float(value)]
    if value.device.type == "cpu":
        return [float(v) for v in value.detach().reshape(-1).tolist()]
    return None


def _mean_square(diff: Tensor) -> Tensor:
    """``[B, ...] -> [B]``: mean of the squared elements over all non-batch dims."""
    return diff.square().reshape(diff.shape[0], -1).mean(dim=1)


@dataclass(kw_only=True)
class SDEStrategy:
    """Base of the per-step kernels.

    Subclasses implement ``_mean`` (the step mean μ, elementwise on broadcast sigmas),
    ``_noise_scale`` and ``_std``. ``provides_log_prob`` is ``False`` for ``ODE`` (class
    attribute) and for a stochastic strategy built with ``eta=0`` (instance attribute set in
    ``__post_init__``): such a step is deterministic and returns ``log_prob=None``.
    """

    name: ClassVar[str] = "base"
    provides_log_prob: bool = field(default=True, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ hooks
    def _mean(
        self, v: Tensor, x: Tensor, sig: Tensor, nxt: Tensor, sigma_max: float | None
    ) -> Tensor:
        raise NotImplementedError

    def _noise_scale(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        raise NotImplementedError

    def _std(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        raise NotImplementedError

    def _check_sigmas(self, sig: list[float], nxt: list[float], sigma_max: float | None) -> None:
        """Validate host-readable sigmas; stochastic kernels need 0 ≤ σ' < σ ≤ 1."""
        for s, n in _pairs(sig, nxt):
            if not (0.0 <= n < s <= 1.0):
                raise ValueError(
                    f"{type(self).__name__}.step needs 0 <= sigma_next < sigma <= 1; "
                    f"got sigma={s}, sigma_next={n}"
                )

    def _log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """Normalised Gaussian log-density, mean over non-batch elements. Returns ``[B]``."""
        return -_mean_square(x_next - mean) / (2.0 * std.square()) - torch.log(std) - _HALF_LOG_2PI

    # ------------------------------------------------------------------ API
    def step(
        self,
        velocity: Tensor,
        latents: Tensor,
        sigma: SigmaLike,
        sigma_next: SigmaLike,
        *,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
        prev_sample: Tensor | None = None,
        storage_dtype: torch.dtype | None = None,
        sigma_max: float | None = None,
    ) -> StepOutput:
        """One step σ → σ' from ``latents[B, ...]`` with model velocity ``velocity[B, ...]``.

        Sampling (``prev_sample is None``): x' = μ + std·z, z = ``noise`` or fp32 normal drawn
        with ``generator``. Replay (``prev_sample`` given): no sampling, the log-prob of the given
        x' is returned. With ``storage_dtype`` the x' is rounded to it **before** the log-prob is
        computed, so replaying the stored value reproduces ``log_prob`` bit-for-bit. The log-prob
        treats x' as data (detached). ``sigma_max`` is the first schedule σ below 1 (``FlowSDE``
        needs it for steps starting at σ = 1; the other kernels ignore it).
        """
        if velocity.shape != latents.shape:
            raise ValueError(
                f"velocity {tuple(velocity.shape)} and latents {tuple(latents.shape)} must match"
            )
        if noise is not None and generator is not None:
            raise ValueError("pass either noise or generator to step(), not both")
        if prev_sample is not None and noise is not None:
            raise ValueError("prev_sample (replay) and noise (sampling) are mutually exclusive")
        if storage_dtype is not None and not storage_dtype.is_floating_point:
            raise ValueError(f"storage_dtype must be a floating dtype, got {storage_dtype}")
        host_sig, host_nxt = _host_values(sigma), _host_values(sigma_next)
        if host_sig is not None and host_nxt is not None:
            self._check_sigmas(host_sig, host_nxt, sigma_max)

        x = latents.to(torch.float32)
        v = velocity.to(torch.float32)
        batch = x.shape[0]
        sig = _per_sample(sigma, batch, x.device)
        nxt = _per_sample(sigma_next, batch, x.device)
        bshape = (batch,) + (1,) * (x.ndim - 1)
        mean = self._mean(v, x, sig.view(bshape), nxt.view(bshape), sigma_max)
        std = self._std(sig, nxt, sigma_max)

        if prev_sample is not None:
            if prev_sample.shape != latents.shape:
                raise ValueError(
                    f"prev_sample {tuple(prev_sample.shape)} must match latents {tuple(latents.shape)}"
                )
            x_next = prev_sample.detach()
        elif not self.provides_log_prob:
            x_next = mean
        else:
            if noise is not None:
                if noise.shape != latents.shape:
                    raise ValueError(
                        f"noise {tuple(noise.shape)} must match latents {tuple(latents.shape)}"
                    )
                z = noise.to(device=x.device, dtype=torch.float32)
            else:
                z = torch.randn(x.shape, generator=generator, device=x.device, dtype=torch.float32)
            x_next = mean + std.view(bshape) * z

        stored = x_next.to(storage_dtype) if storage_dtype is not None else x_next.float()
        log_prob = None
        if self.provides_log_prob:
            log_prob = self._log_prob(stored.detach().float(), mean, std)
        return StepOutput(next_latents=stored, log_prob=log_prob, mean=mean, std=std)

    def noise_scale(
        self, sigma: SigmaLike, sigma_next: SigmaLike, *, sigma_max: float | None = None
    ) -> Tensor:
        """The kernel's noise scale before any sqrt(−Δ) factor (what ``kl(form="reference")``
        divides by). Shape: broadcast of the sigma inputs (0-d for python floats), fp32."""
        device = next((t.device for t in (sigma, sigma_next) if isinstance(t, Tensor)), None)
        return self._noise_scale(
            _as_tensor(sigma, device), _as_tensor(sigma_next, device), sigma_max
        )

    def step_std(
        self, sigma: SigmaLike, sigma_next: SigmaLike, *, sigma_max: float | None = None
    ) -> Tensor:
        """The Gaussian std of the step (σ_t of docs/math.md's KL / Flow-DPPO). Shape: broadcast of
        the sigma inputs (0-d for python floats), fp32."""
        device = next((t.device for t in (sigma, sigma_next) if isinstance(t, Tensor)), None)
        return self._std(_as_tensor(sigma, device), _as_tensor(sigma_next, device), sigma_max)

    def kl(
        self,
        mean_a: Tensor,
        mean_b: Tensor,
        sigma: SigmaLike,
        sigma_next: SigmaLike,
        form: KLForm = "gaussian",
        *,
        sigma_max: float | None = None,
    ) -> Tensor:
        """KL between two steps of equal variance with means ``mean_a``/``mean_b`` ``[B, ...]``.

        ``"gaussian"``: mean ‖μa − μb‖² / (2·std²), the exact per-element KL.
        ``"reference"``: mean ‖μa − μb‖² / (2·noise_scale²), the Flow-GRPO code's variant (see
        each strategy's docstring for what its noise scale is). Returns ``[B]`` fp32.
        """
        if form not in ("gaussian", "reference"):
            raise ValueError(f"kl form must be 'gaussian' or 'reference', got {form!r}")
        if not self.provides_log_prob:
            raise ValueError(
                f"{self!r} is deterministic (std = 0): a KL between its steps is undefined; "
                "use a stochastic strategy with eta > 0"
            )
        if mean_a.shape != mean_b.shape:
            raise ValueError(f"mean shapes differ: {tuple(mean_a.shape)} vs {tuple(mean_b.shape)}")
        batch, device = mean_a.shape[0], mean_a.device
        sig, nxt = _per_sample(sigma, batch, device), _per_sample(sigma_next, batch, device)
        scale = (
            self._std(sig, nxt, sigma_max)
            if form == "gaussian"
            else self._noise_scale(sig, nxt, sigma_max)
        )
        return _mean_square(mean_a.float() - mean_b.float()) / (2.0 * scale.square())


def _pairs(sig: list[float], nxt: list[float]) -> list[tuple[float, float]]:
    """Pair host sigma lists elementwise, broadcasting a length-1 side."""
    if len(sig) == len(nxt):
        return list(zip(sig, nxt, strict=True))
    if len(sig) == 1:
        return [(sig[0], n) for n in nxt]
    if len(nxt) == 1:
        return [(s, nxt[0]) for s in sig]
    raise ValueError(f"sigma ({len(sig)}) and sigma_next ({len(nxt)}) lengths differ")


def _check_eta(cls_name: str, eta: float, upper: float | None = None) -> None:
    require(
        math.isfinite(eta) and eta >= 0.0,
        f"{cls_name}.eta must be a finite number >= 0, got {eta}",
    )
    if upper is not None:
        require(eta <= upper, f"{cls_name}.eta must be <= {upper}, got {eta}")


@dataclass(kw_only=True)
class FlowSDE(SDEStrategy):
    """Flow-GRPO SDE. ``eta`` is the noise level a of docs/math.md.

    s = a·sqrt(σ / (1 − σ̃)) with σ̃ = ``sigma_max`` where σ = 1, else σ̃ = σ (the numerator
    keeps σ = 1, as the Flow-GRPO reference does); μ = x + [v + s²/(2σ)·(x + (1 − σ)v)]·Δ;
    std = s·sqrt(−Δ). ``kl(form="reference")`` divides by 2s² (no −Δ factor).
    ``eta = 0`` is exactly the Euler step x + v·Δ and provides no log-prob.
    """

    name: ClassVar[str] = "flow"
    eta: float = 0.7

    def __post_init__(self) -> None:
        _check_eta("FlowSDE", self.eta)
        self.provides_log_prob = self.eta > 0.0

    def _check_sigmas(self, sig: list[float], nxt: list[float], sigma_max: float | None) -> None:
        super()._check_sigmas(sig, nxt, sigma_max)
        if self.eta > 0.0 and any(s >= 1.0 for s in sig):
            if sigma_max is None:
                raise ValueError(
                    "FlowSDE step at sigma = 1 needs sigma_max (the first schedule sigma below 1, "
                    "i.e. sigmas[1]); pass step(..., sigma_max=float(sigmas[1]))"
                )
            if not (0.0 < sigma_max < 1.0):
                raise ValueError(f"FlowSDE sigma_max must be in (0, 1), got {sigma_max}")

    def _noise_scale(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        if self.eta == 0.0:
            return torch.zeros_like(sig)
        denom_sigma = sig if sigma_max is None else torch.where(sig == 1.0, sigma_max, sig)
        return self.eta * torch.sqrt(sig / (1.0 - denom_sigma))

    def _std(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return self._noise_scale(sig, nxt, sigma_max) * torch.sqrt(sig - nxt)

    def _mean(
        self, v: Tensor, x: Tensor, sig: Tensor, nxt: Tensor, sigma_max: float | None
    ) -> Tensor:
        dt = nxt - sig
        s = self._noise_scale(sig, nxt, sigma_max)
        drift = v + s.square() / (2.0 * sig) * (x + (1.0 - sig) * v)
        return x + drift * dt


@dataclass(kw_only=True)
class DanceSDE(SDEStrategy):
    """DanceGRPO SDE. x̂₀ = x − σv, score = −(x − (1 − σ)x̂₀)/σ², μ = x + vΔ − ½η²·score·Δ,
    std = η·sqrt(−Δ). ``kl(form="reference")`` divides by 2η² (no −Δ factor)."""

    name: ClassVar[str] = "dance"
    eta: float = 0.3

    def __post_init__(self) -> None:
        _check_eta("DanceSDE", self.eta)
        self.provides_log_prob = self.eta > 0.0

    def _noise_scale(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return torch.full_like(sig, self.eta)

    def _std(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return self.eta * torch.sqrt(sig - nxt)

    def _mean(
        self, v: Tensor, x: Tensor, sig: Tensor, nxt: Tensor, sigma_max: float | None
    ) -> Tensor:
        dt = nxt - sig
        x0 = x - sig * v
        score = -(x - (1.0 - sig) * x0) / sig.square()
        return x + v * dt - (0.5 * self.eta**2) * score * dt


@dataclass(kw_only=True)
class CPS(SDEStrategy):
    """Coefficient-preserving sampling. s = σ'·sin(η·π/2), x̂₀ = x − σv, x̂₁ = x + (1 − σ)v,
    μ = (1 − σ')x̂₀ + sqrt(σ'² − s²)·x̂₁, std = s.

    ``log_prob_form="reference"`` (default, what the CPS / Flow-GRPO-Fast code and its clip
    1e-5 use): log p = −mean (x' − μ)². ``"gaussian"``: the normalised Gaussian mean log-density,
    whose log-ratios are the reference ones divided by 2s²; tune clip ranges to the form.
    ``kl`` divides by 2s² for both forms (s already is the step std).
    """

    name: ClassVar[str] = "cps"
    eta: float = 0.8
    log_prob_form: Literal["reference", "gaussian"] = "reference"

    def __post_init__(self) -> None:
        _check_eta("CPS", self.eta, upper=1.0)
        require(
            self.log_prob_form in ("reference", "gaussian"),
            f"CPS.log_prob_form must be 'reference' or 'gaussian', got {self.log_prob_form!r}",
        )
        self.provides_log_prob = self.eta > 0.0

    def _check_sigmas(self, sig: list[float], nxt: list[float], sigma_max: float | None) -> None:
        super()._check_sigmas(sig, nxt, sigma_max)
        if (
            self.log_prob_form == "gaussian"
            and self.provides_log_prob
            and any(n == 0.0 for n in nxt)
        ):
            raise ValueError(
                "CPS step to sigma_next = 0 has std 0, so the gaussian log-prob is undefined; "
                "run that step with ODE (sde_steps exclude the last step by default)"
            )

    def _noise_scale(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return nxt * math.sin(self.eta * math.pi / 2.0)

    def _std(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return self._noise_scale(sig, nxt, sigma_max)

    def _mean(
        self, v: Tensor, x: Tensor, sig: Tensor, nxt: Tensor, sigma_max: float | None
    ) -> Tensor:
        s = self._noise_scale(sig, nxt, sigma_max)
        x0 = x - sig * v
        x1 = x + (1.0 - sig) * v
        return (1.0 - nxt) * x0 + torch.sqrt((nxt.square() - s.square()).clamp_min(0.0)) * x1

    def _log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        if self.log_prob_form == "reference":
            return -_mean_square(x_next - mean)
        return super()._log_prob(x_next, mean, std)


@dataclass(kw_only=True)
class ODE(SDEStrategy):
    """Deterministic Euler step x' = x + v·Δ (bit-identical to diffusers'
    ``FlowMatchEulerDiscreteScheduler.step`` for fp32 inputs). No log-prob, std = 0."""

    name: ClassVar[str] = "ode"
    provides_log_prob: bool = field(default=False, init=False, repr=False, compare=False)

    def _check_sigmas(self, sig: list[float], nxt: list[float], sigma_max: float | None) -> None:
        """Any finite sigmas are accepted (e.g. inverted schedules)."""

    def _noise_scale(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return sig.new_zeros(torch.broadcast_shapes(sig.shape, nxt.shape))

    def _std(self, sig: Tensor, nxt: Tensor, sigma_max: float | None) -> Tensor:
        return self._noise_scale(sig, nxt, sigma_max)

    def _mean(
        self, v: Tensor, x: Tensor, sig: Tensor, nxt: Tensor, sigma_max: float | None
    ) -> Tensor:
        return x + v * (nxt - sig)


STRATEGIES: dict[str, type[SDEStrategy]] = {
    "flow": FlowSDE,
    "cps": CPS,
    "dance": DanceSDE,
    "ode": ODE,
}


def build_strategy(name: str, **kwargs: object) -> SDEStrategy:
    """Build a strategy by registry name (``"flow"``, ``"cps"``, ``"dance"``, ``"ode"``)."""
    require(
        name in STRATEGIES,
        f"unknown SDE strategy {name!r}; choose one of {sorted(STRATEGIES)}",
    )
    return STRATEGIES[name](**kwargs)
