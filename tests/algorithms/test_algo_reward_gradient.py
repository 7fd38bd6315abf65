"""Reward-gradient losses (ReFL, DRaFT-K, DRaFT-LV, AlignProp, DR-Tune) on the tiny stand-in
family: which denoising steps carry a weight gradient, whether the gradient reaches the input
noise, and its exact value where the method's stop-gradients make it closed form.

Every step's velocity gets a zero offset δ_j (a leaf of its own): δ_j.grad ≠ 0 exactly when
step j ran with autograd, and δ_j.grad = ∂L/∂v_j = Δ_j·∂L/∂x_{j+1}. With DR-Tune's detached
denoiser inputs the Euler skip path is the only route back, so ∂L/∂x_{j+1} = ∂L/∂x₀ for every
j and ∂L/∂x_T = ∂L/∂x₀: tested to 1e-6, which fails when the stop-gradient is removed."""

from __future__ import annotations

import pytest
import torch
from flow_fakes import CHANNELS, SIDE, TinyBundle, TinyPipeline, sample

from unirl.algorithms.reward_gradient import (
    AlignProp,
    DRaFT,
    DRTune,
    ReFL,
    RewardGradientLoss,
    euler_chain,
)
from unirl.config import ConfigError
from unirl.models.common.denoise import forward_conditions
from unirl.reward.differentiable import DifferentiableBrightness
from unirl.sde import ODE

STEPS = 5
N = 4
TOL = 1e-6


class TracingBundle(TinyBundle):
    """TinyBundle whose velocity at step j is v + δ_j (δ_j = 0, a leaf per σ)."""

    def __init__(self) -> None:
        super().__init__()
        self.deltas: dict[float, torch.Tensor] = {}

    def delta(self, sigma: float) -> torch.Tensor:
        key = round(sigma, 6)
        if key not in self.deltas:
            self.deltas[key] = torch.zeros(1, CHANNELS, SIDE, SIDE, requires_grad=True)
        return self.deltas[key]

    def predict_velocity(self, latents, sigma, conditions):  # type: ignore[override]
        v = super().predict_velocity(latents, sigma, conditions)
        return v + self.delta(float(sigma.flatten()[0]))


def _setup(guidance: float = 1.0, stored: list[int] | None = None):
    pipeline = TinyPipeline(bundle=TracingBundle(), strategy=ODE())
    steps = stored if stored is not None else list(range(STEPS))
    conditions, segment = sample(
        pipeline,
        n=N,
        steps=STEPS,
        sde_indices=torch.tensor([steps] * N),
        guidance_scale=guidance,
    )
    return pipeline, conditions, segment


def _reward() -> DifferentiableBrightness:
    return DifferentiableBrightness(target=0.8)


def _run(algo: RewardGradientLoss, conditions, segment, *, rollout: int = 3):
    """One loss + backward with the stored chain inputs as a leaf (to read ∂L/∂latents)."""
    latents = segment.latents.detach().clone().requires_grad_(True)
    seg = type(segment)(**{**segment.__dict__, "latents": latents})
    algo.start_rollout(rollout)
    result = algo.compute_loss_and_backward(conditions, seg, torch.zeros(N), loss_scale=1.0)
    return result, latents


def _grad_steps(pipeline, segment) -> dict[int, torch.Tensor | None]:
    sig = segment.sigmas.tolist()
    deltas = pipeline.bundle.deltas
    return {j: getattr(deltas.get(round(sig[j], 6)), "grad", None) for j in range(STEPS)}


def _zero_deltas(pipeline) -> None:
    for d in pipeline.bundle.deltas.values():
        d.grad = None


def _dl_dx0(pipeline, x0: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    leaf = x0.detach().clone().requires_grad_(True)
    loss = -scale * _reward()(pipeline.decode(leaf)).mean()
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


def _x0(algo: RewardGradientLoss, conditions, segment) -> torch.Tensor:
    with torch.no_grad():
        return algo.denoised(conditions, segment)[0]


def _weights_have_grad(pipeline) -> bool:
    return all(
        p.grad is not None and float(p.grad.abs().sum()) > 0 for p in pipeline.bundle.parameters()
    )


# ----------------------------------------------------------------------------- the chain
def test_euler_chain_without_gradients_is_the_rollout() -> None:
    """Run from x_T with no gradient step, the chain lands on the rollout's x₀ (the ODE)."""
    pipeline, conditions, segment = _setup(guidance=4.0)
    fwd = forward_conditions(pipeline, conditions, segment.guidance_scale)
    x0 = euler_chain(
        pipeline, fwd, segment.latents[:, 0], segment.sigmas, segment.guidance_scale, grad_steps=()
    )
    torch.testing.assert_close(x0, segment.final_latents.float(), atol=1e-6, rtol=0.0)


# ----------------------------------------------------------------------------- methods
def test_drtune_gradient_is_the_skip_path_to_every_trained_step_and_the_noise() -> None:
    pipeline, conditions, segment = _setup()
    algo = DRTune(pipeline=pipeline, reward=_reward(), num_trained=2, checkpoint=True)
    algo.start_rollout(3)
    trained = algo.trained_steps(STEPS)
    assert len(trained) == 2 and trained[1] - trained[0] == STEPS // 2
    x0 = _x0(algo, conditions, segment)
    _, latents = _run(algo, conditions, segment)
    g0 = _dl_dx0(pipeline, x0)
    sig = segment.sigmas.double()
    for j, grad in _grad_steps(pipeline, segment).items():
        if j in trained:  # ∂L/∂v_j = Δ_j·∂L/∂x₀, summed over the rows δ_j is shared by
            expected = ((sig[j + 1] - sig[j]) * g0.double()).sum(0, keepdim=True)
            torch.testing.assert_close(grad.double(), expected, atol=TOL, rtol=0.0)
        else:
            assert grad is None, f"step {j} is not trained but carried a gradient"
    # the input noise: ∂L/∂x_T = ∂L/∂x₀ exactly (stop-gradient on every denoiser input)
    torch.testing.assert_close(latents.grad[:, 0], g0, atol=TOL, rtol=0.0)
    assert float(latents.grad[:, 1:].abs().max()) == 0.0  # only x_T is the chain's start
    assert _weights_have_grad(pipeline)


def test_drtune_without_the_stop_gradient_is_a_different_gradient() -> None:
    """Move the stop-gradient (inputs not detached): ∂L/∂x_T no longer equals ∂L/∂x₀."""
    pipeline, conditions, segment = _setup()
    fwd = forward_conditions(pipeline, conditions, 1.0)
    x_T = segment.latents[:, 0].clone().requires_grad_(True)
    x0 = euler_chain(pipeline, fwd, x_T, segment.sigmas, 1.0, grad_steps={0, 2})
    g0 = _dl_dx0(pipeline, x0)
    (-_reward()(pipeline.decode(x0)).mean()).backward()
    assert float((x_T.grad - g0).abs().max()) > 100 * TOL  # measured 3e-4


@pytest.mark.parametrize("k", [1, 3])
def test_draft_k_backpropagates_through_the_last_k_steps_only(k: int) -> None:
    pipeline, conditions, segment = _setup()
    algo = DRaFT(pipeline=pipeline, reward=_reward(), k=k)
    x0 = _x0(algo, conditions, segment)
    result, latents = _run(algo, conditions, segment)
    grads = _grad_steps(pipeline, segment)
    assert [j for j, g in grads.items() if g is not None] == list(range(STEPS - k, STEPS))
    g0 = _dl_dx0(pipeline, x0)
    last = STEPS - 1  # the last step's ∂L/∂v is Δ·∂L/∂x₀ whatever K is
    expected = (segment.sigmas[last + 1] - segment.sigmas[last]) * g0.sum(0, keepdim=True)
    torch.testing.assert_close(grads[last], expected, atol=TOL, rtol=0.0)
    # no gradient to the noise: the chain restarts at the stored x_{T-K}, a constant
    assert float(latents.grad[:, 0].abs().max()) == 0.0 if k < STEPS else True
    # full backprop: ∂L/∂x_{T-K} runs through the network (not the skip path alone)
    slot = STEPS - k
    if k > 1:
        assert float((latents.grad[:, slot] - g0).abs().max()) > 1e-4
    assert float(latents.grad[:, slot].abs().max()) > 0
    assert _weights_have_grad(pipeline)
    assert algo.summarize(result.terms)["reward_grad/grad_steps"] == k


def test_draft_lv_denoises_renoised_copies_of_the_final_sample() -> None:
    pipeline, conditions, segment = _setup()
    algo = DRaFT(pipeline=pipeline, reward=_reward(), k=1, lv_copies=3)
    final = segment.final_latents.detach().clone().requires_grad_(True)
    seg = type(segment)(**{**segment.__dict__, "final_latents": final})
    algo.start_rollout(0)
    x0 = algo.denoised(conditions, seg)[0]
    assert x0.shape[0] == 3 * N
    # x̂₀ = x − σ·v(x) with x = (1 − σ)·x₀ + σ·ε: linear in x₀ through the skip path; the copies
    # are distinct draws
    copies = x0.detach().reshape(3, N, -1)
    assert float((copies[0] - copies[1]).abs().max()) > 1e-3
    _zero_deltas(pipeline)
    algo.start_rollout(0)
    result = algo.compute_loss_and_backward(conditions, seg, torch.zeros(N), loss_scale=1.0)
    grads = _grad_steps(pipeline, segment)
    assert [j for j, g in grads.items() if g is not None] == [STEPS - 1]
    assert final.grad is None, "x₀ is re-noised as data: no gradient reaches the rollout's sample"
    assert result.terms["reward_grad/reward"].shape == (N,)  # copies averaged per sample
    assert _weights_have_grad(pipeline)


def test_refl_trains_one_stored_late_step_from_its_x0_prediction() -> None:
    pipeline, conditions, segment = _setup(stored=[3])
    algo = ReFL(pipeline=pipeline, reward=_reward())
    x0 = _x0(algo, conditions, segment)
    sig = segment.sigmas
    torch.testing.assert_close(
        x0,
        segment.latents[:, 0]
        - sig[3]
        * pipeline.bundle.predict_velocity(
            segment.latents[:, 0], sig[3].expand(N), conditions
        ).detach(),
        atol=1e-6,
        rtol=0.0,
    )
    _zero_deltas(pipeline)
    _, latents = _run(algo, conditions, segment)
    grads = _grad_steps(pipeline, segment)
    assert [j for j, g in grads.items() if g is not None] == [3]
    g0 = _dl_dx0(pipeline, x0)
    torch.testing.assert_close(grads[3], -sig[3] * g0.sum(0, keepdim=True), atol=TOL, rtol=0.0)
    # the input of the trained step is the rollout's (no-grad) prefix: a constant for the loss
    assert latents.grad is not None
    assert _weights_have_grad(pipeline)


def test_alignprop_truncation_is_random_per_rollout_and_shared_by_micro_batches() -> None:
    pipeline, conditions, segment = _setup()
    algo = AlignProp(pipeline=pipeline, reward=_reward(), max_steps=STEPS)
    draws = []
    for r in range(12):
        algo.start_rollout(r)
        draws.append(algo.truncation(STEPS))
        assert algo.truncation(STEPS) == draws[-1]  # same K for every micro-batch
    assert set(draws) <= set(range(1, STEPS + 1)) and len(set(draws)) >= 3
    rollout = next(r for r, k in enumerate(draws) if 1 < k < STEPS)  # a truncated chain
    k = draws[rollout]
    result, latents = _run(algo, conditions, segment, rollout=rollout)
    grads = _grad_steps(pipeline, segment)
    assert [j for j, g in grads.items() if g is not None] == list(range(STEPS - k, STEPS))
    assert float(latents.grad[:, 0].abs().max()) == 0.0  # truncated: no gradient to x_T
    assert result.terms["reward_grad/grad_steps"].item() == k


def test_checkpointing_gives_the_same_gradients() -> None:
    out = []
    for ckpt in (False, True):
        pipeline, conditions, segment = _setup(guidance=3.0)
        algo = DRaFT(pipeline=pipeline, reward=_reward(), k=3, checkpoint=ckpt)
        _run(algo, conditions, segment)
        out.append([p.grad.clone() for p in pipeline.bundle.parameters()])
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def test_missing_stored_step_and_bad_knobs_are_refused() -> None:
    pipeline, conditions, segment = _setup(stored=[1, 2])
    with pytest.raises(ValueError, match="exclude_last: false"):
        _run(DRaFT(pipeline=pipeline, reward=_reward(), k=1), conditions, segment)
    with pytest.raises(ConfigError, match=r"algorithm\.k=1"):
        DRaFT(pipeline=pipeline, reward=_reward(), k=2, lv_copies=2)
    with pytest.raises(ConfigError, match="num_trained"):
        DRTune(pipeline=pipeline, reward=_reward(), num_trained=0)
    with pytest.raises(ConfigError, match="target"):
        DifferentiableBrightness(target=1.5)
