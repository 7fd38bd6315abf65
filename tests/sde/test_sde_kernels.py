"""Kernels vs independent float64 implementations of docs/math.md, replay exactness, ODE vs diffusers."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.config import ConfigError
from unirl.sde import (
    CPS,
    ODE,
    STRATEGIES,
    DanceSDE,
    FlowSDE,
    build_strategy,
    flow_match_sigmas,
    timesteps_from_sigmas,
)

SHAPE = (4, 3, 5, 6)
# SD3.5-like schedule: shift 3, 10 steps; every value is exactly representable in fp32.
SIGMAS = [float(s) for s in flow_match_sigmas(10, shift=3.0)]
SIGMA_MAX = SIGMAS[1]
# (step index) pairs exercised: the σ = 1 start, middle steps, and the final step to σ' = 0.
STEPS = [0, 1, 4, 8, 9]
LP_ATOL, LP_RTOL = 1e-6, 1e-6  # fp32 step math vs float64 reference


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(SHAPE, generator=g)
    x = torch.randn(SHAPE, generator=g)
    z = torch.randn(SHAPE, generator=g)
    return v, x, z


# ---------------------------------------------------------------- float64 references (per sample)
def _ref_flow(v, x, sig, nxt, a, smax):
    """Flow-GRPO SDE, coefficients grouped on x and v (different shape from the kernel)."""
    denom = smax if sig == 1.0 else sig
    s = a * math.sqrt(sig / (1.0 - denom))
    dt = nxt - sig
    mean = x * (1.0 + s * s / (2.0 * sig) * dt) + v * (1.0 + s * s * (1.0 - sig) / (2.0 * sig)) * dt
    return mean, s * math.sqrt(-dt)


def _ref_dance(v, x, sig, nxt, eta):
    """DanceGRPO with the score expanded: score = −(x + (1 − σ)v)/σ."""
    dt = nxt - sig
    mean = x + v * dt + 0.5 * eta * eta * (x + (1.0 - sig) * v) / sig * dt
    return mean, eta * math.sqrt(-dt)


def _ref_cps(v, x, sig, nxt, eta):
    s = nxt * math.sin(eta * math.pi / 2.0)
    x0 = x - sig * v
    x1 = x + (1.0 - sig) * v
    mean = (1.0 - nxt) * x0 + math.sqrt(max(nxt * nxt - s * s, 0.0)) * x1
    return mean, s


def _ref_gauss_lp(xn, mean, std):
    elem = -((xn - mean) ** 2) / (2.0 * std * std) - math.log(std) - 0.5 * math.log(2.0 * math.pi)
    return elem.mean().item()


def _ref_step(kind, v, x, sig, nxt, eta):
    """Returns (mean[B,...], std[B]) float64 computed one sample at a time."""
    means, stds = [], []
    for b in range(v.shape[0]):
        vb, xb = v[b].double(), x[b].double()
        if kind == "flow":
            m, s = _ref_flow(vb, xb, sig, nxt, eta, SIGMA_MAX)
        elif kind == "dance":
            m, s = _ref_dance(vb, xb, sig, nxt, eta)
        else:
            m, s = _ref_cps(vb, xb, sig, nxt, eta)
        means.append(m)
        stds.append(s)
    return torch.stack(means), torch.tensor(stds, dtype=torch.float64)


CASES = [
    ("flow", FlowSDE(eta=0.7), 0.7),
    ("dance", DanceSDE(eta=0.3), 0.3),
    ("cps", CPS(eta=0.8), 0.8),
    ("cps", CPS(eta=0.8, log_prob_form="gaussian"), 0.8),
]


# The gaussian CPS log-prob is undefined at σ' = 0 (std 0); that case is tested to raise.
REFERENCE_CASES = [
    pytest.param(kind, strategy, eta, i, id=f"{strategy!r}-step{i}")
    for kind, strategy, eta in CASES
    for i in STEPS
    if not (getattr(strategy, "log_prob_form", "") == "gaussian" and SIGMAS[i + 1] == 0.0)
]


@pytest.mark.parametrize(("kind", "strategy", "eta", "i"), REFERENCE_CASES)
def test_kernel_matches_float64_reference(kind, strategy, eta, i):
    sig, nxt = SIGMAS[i], SIGMAS[i + 1]
    v, x, z = _inputs(i)
    out = strategy.step(v, x, sig, nxt, noise=z, sigma_max=SIGMA_MAX)
    ref_mean, ref_std = _ref_step(kind, v, x, sig, nxt, eta)

    assert out.mean.dtype == torch.float32 and out.next_latents.dtype == torch.float32
    assert out.std.shape == (SHAPE[0],) and out.log_prob.shape == (SHAPE[0],)
    torch.testing.assert_close(out.mean.double(), ref_mean, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.std.double(), ref_std, atol=1e-6, rtol=1e-6)
    ref_next = ref_mean + ref_std.view(-1, 1, 1, 1) * z.double()
    torch.testing.assert_close(out.next_latents.double(), ref_next, atol=1e-6, rtol=1e-6)

    xn = out.next_latents.double()
    for b in range(SHAPE[0]):
        if isinstance(strategy, CPS) and strategy.log_prob_form == "reference":
            ref_lp = (-((xn[b] - ref_mean[b]) ** 2)).mean().item()
        else:
            ref_lp = _ref_gauss_lp(xn[b], ref_mean[b], ref_std[b].item())
        err = abs(out.log_prob[b].item() - ref_lp)
        assert err <= LP_ATOL + LP_RTOL * abs(ref_lp), (b, out.log_prob[b].item(), ref_lp)


@pytest.mark.parametrize(("kind", "strategy", "eta"), CASES, ids=lambda c: repr(c))
def test_per_sample_sigmas_match_scalar_calls(kind, strategy, eta):
    idx = [1, 3, 5, 7]
    sig = torch.tensor([SIGMAS[i] for i in idx])
    nxt = torch.tensor([SIGMAS[i + 1] for i in idx])
    v, x, z = _inputs(7)
    batched = strategy.step(v, x, sig, nxt, noise=z)
    for b in range(SHAPE[0]):
        one = strategy.step(
            v[b : b + 1], x[b : b + 1], float(sig[b]), float(nxt[b]), noise=z[b : b + 1]
        )
        assert torch.equal(one.mean[0], batched.mean[b])
        assert torch.equal(one.next_latents[0], batched.next_latents[b])
        torch.testing.assert_close(one.log_prob[0], batched.log_prob[b], atol=1e-7, rtol=0)


@pytest.mark.parametrize("strategy", [s for _, s, _ in CASES], ids=repr)
@pytest.mark.parametrize("i", [0, 4, 8])
def test_replay_reproduces_log_prob_exactly(strategy, i):
    v, x, _ = _inputs(i)
    sampled = strategy.step(
        v,
        x,
        SIGMAS[i],
        SIGMAS[i + 1],
        generator=torch.Generator().manual_seed(3),
        sigma_max=SIGMA_MAX,
    )
    replay = strategy.step(
        v, x, SIGMAS[i], SIGMAS[i + 1], prev_sample=sampled.next_latents, sigma_max=SIGMA_MAX
    )
    assert torch.equal(replay.log_prob, sampled.log_prob)
    assert torch.equal(replay.mean, sampled.mean)
    assert torch.equal(replay.next_latents, sampled.next_latents)


@pytest.mark.parametrize("strategy", [s for _, s, _ in CASES], ids=repr)
def test_bf16_storage_replays_exactly(strategy):
    i = 3
    v, x, z = _inputs(11)
    stored = strategy.step(v, x, SIGMAS[i], SIGMAS[i + 1], noise=z, storage_dtype=torch.bfloat16)
    assert stored.next_latents.dtype == torch.bfloat16
    for replay_dtype in (torch.bfloat16, None):
        replay = strategy.step(
            v,
            x,
            SIGMAS[i],
            SIGMAS[i + 1],
            prev_sample=stored.next_latents,
            storage_dtype=replay_dtype,
        )
        assert torch.equal(replay.log_prob, stored.log_prob)
    # The log-prob really is of the rounded value: the unrounded fp32 sample scores differently.
    unrounded = strategy.step(v, x, SIGMAS[i], SIGMAS[i + 1], noise=z)
    assert torch.equal(unrounded.next_latents.to(torch.bfloat16), stored.next_latents)
    assert not torch.equal(unrounded.log_prob, stored.log_prob)


def test_generator_sampling_is_mean_plus_std_times_randn():
    v, x, _ = _inputs(5)
    strategy = FlowSDE(eta=0.7)
    a = strategy.step(v, x, SIGMAS[2], SIGMAS[3], generator=torch.Generator().manual_seed(9))
    b = strategy.step(v, x, SIGMAS[2], SIGMAS[3], generator=torch.Generator().manual_seed(9))
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a.next_latents, b.next_latents)
    assert torch.equal(a.next_latents, a.mean + a.std.view(-1, 1, 1, 1) * z)


@pytest.mark.parametrize("i", range(10))
def test_eta_zero_is_exactly_the_euler_ode(i):
    v, x, _ = _inputs(i)
    ode = ODE().step(v, x, SIGMAS[i], SIGMAS[i + 1])
    for strategy in (FlowSDE(eta=0.0), DanceSDE(eta=0.0)):
        out = strategy.step(v, x, SIGMAS[i], SIGMAS[i + 1], generator=torch.Generator())
        assert strategy.provides_log_prob is False and out.log_prob is None
        assert torch.equal(out.next_latents, ode.next_latents)
        assert torch.equal(out.mean, x + v * (SIGMAS[i + 1] - SIGMAS[i]))
    assert ode.log_prob is None and torch.equal(ode.std, torch.zeros(SHAPE[0]))


@pytest.mark.parametrize(("shift", "steps"), [(3.0, 10), (1.0, 4)])
def test_ode_matches_diffusers_euler_step(shift, steps):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    sigmas = flow_match_sigmas(steps, shift=shift)
    assert torch.equal(timesteps_from_sigmas(sigmas), scheduler.timesteps)
    g = torch.Generator().manual_seed(1)
    x_ref = x_ours = torch.randn(SHAPE, generator=g)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(SHAPE, generator=g)
        x_ref = scheduler.step(v, t, x_ref).prev_sample
        x_ours = ODE().step(v, x_ours, sigmas[i], sigmas[i + 1]).next_latents
        assert torch.equal(x_ours, x_ref), i


def test_kl_forms():
    i = 4
    sig, nxt = SIGMAS[i], SIGMAS[i + 1]
    v, x, _ = _inputs(2)
    v_b = v + 0.5 * torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))
    for strategy in (FlowSDE(eta=0.7), DanceSDE(eta=0.3), CPS(eta=0.8, log_prob_form="gaussian")):
        a = strategy.step(v, x, sig, nxt, prev_sample=torch.zeros(SHAPE))
        b = strategy.step(v_b, x, sig, nxt, prev_sample=torch.zeros(SHAPE))
        kl = strategy.kl(a.mean, b.mean, sig, nxt)
        # Equal-variance Gaussians: KL(a‖b) = log p_a(μ_a) − log p_b(μ_a).
        lp_a = strategy.step(v, x, sig, nxt, prev_sample=a.mean).log_prob
        lp_b = strategy.step(v_b, x, sig, nxt, prev_sample=a.mean).log_prob
        torch.testing.assert_close(kl, lp_a - lp_b, atol=1e-5, rtol=1e-5)
        d2 = ((a.mean.double() - b.mean.double()) ** 2).flatten(1).mean(1)
        scale = strategy.noise_scale(sig, nxt).double()
        ref = strategy.kl(a.mean, b.mean, sig, nxt, form="reference")
        torch.testing.assert_close(ref.double(), d2 / (2 * scale**2), atol=0, rtol=1e-5)
    # FlowSDE / Dance: the reference form omits the −Δ factor of the step variance.
    for strategy in (FlowSDE(eta=0.7), DanceSDE(eta=0.3)):
        a = strategy.step(v, x, sig, nxt, prev_sample=torch.zeros(SHAPE))
        b = strategy.step(v_b, x, sig, nxt, prev_sample=torch.zeros(SHAPE))
        ratio = strategy.kl(a.mean, b.mean, sig, nxt, "reference") / strategy.kl(
            a.mean, b.mean, sig, nxt
        )
        torch.testing.assert_close(ratio, torch.full((SHAPE[0],), sig - nxt), atol=0, rtol=1e-5)
    # CPS: s already is the step std, so both forms agree.
    cps = CPS(eta=0.8)
    a = cps.step(v, x, sig, nxt, prev_sample=torch.zeros(SHAPE))
    b = cps.step(v_b, x, sig, nxt, prev_sample=torch.zeros(SHAPE))
    assert torch.equal(
        cps.kl(a.mean, b.mean, sig, nxt, "reference"), cps.kl(a.mean, b.mean, sig, nxt)
    )


def test_step_std_and_noise_scale_shapes_and_values():
    flow = FlowSDE(eta=0.7)
    std = flow.step_std(SIGMAS[3], SIGMAS[4])
    assert std.shape == () and std.dtype == torch.float32
    expected = 0.7 * math.sqrt(SIGMAS[3] / (1 - SIGMAS[3])) * math.sqrt(SIGMAS[3] - SIGMAS[4])
    assert abs(std.item() - expected) < 1e-6
    batch = flow.step_std(torch.tensor(SIGMAS[:4]), torch.tensor(SIGMAS[1:5]), sigma_max=SIGMA_MAX)
    assert batch.shape == (4,)
    v, x, _ = _inputs(0)
    out = flow.step(v, x, torch.tensor(SIGMAS[:4]), torch.tensor(SIGMAS[1:5]), sigma_max=SIGMA_MAX)
    assert torch.equal(out.std, batch)
    assert CPS(eta=1.0).noise_scale(0.5, 0.25).item() == 0.25
    assert DanceSDE(eta=0.3).noise_scale(0.5, 0.25).item() == pytest.approx(0.3)


def test_flow_sigma_one_uses_sigma_max_in_denominator_only():
    std = FlowSDE(eta=0.7).noise_scale(1.0, SIGMAS[1], sigma_max=SIGMA_MAX)
    assert abs(std.item() - 0.7 * math.sqrt(1.0 / (1.0 - SIGMA_MAX))) < 1e-5


def test_errors():
    v, x, z = _inputs(0)
    with pytest.raises(ValueError, match="sigma_max"):
        FlowSDE().step(v, x, 1.0, SIGMAS[1])
    with pytest.raises(ValueError, match="sigma_next < sigma"):
        FlowSDE().step(v, x, 0.3, 0.5)
    with pytest.raises(ValueError, match="gaussian log-prob is undefined"):
        CPS(log_prob_form="gaussian").step(v, x, SIGMAS[9], 0.0)
    with pytest.raises(ValueError, match="noise"):
        FlowSDE().step(v, x, 0.5, 0.4, noise=z[:2])
    with pytest.raises(ValueError, match="not both"):
        FlowSDE().step(v, x, 0.5, 0.4, noise=z, generator=torch.Generator())
    with pytest.raises(ValueError, match="deterministic"):
        ODE().kl(x, x, 0.5, 0.4)
    with pytest.raises(ValueError, match="form"):
        FlowSDE().kl(x, x, 0.5, 0.4, form="sum")
    with pytest.raises(ValueError, match=r"\[B\]"):
        FlowSDE().step(v, x, torch.tensor([0.5, 0.4]), 0.3)
    with pytest.raises(ConfigError, match=r"FlowSDE\.eta"):
        FlowSDE(eta=-0.1)
    with pytest.raises(ConfigError, match=r"CPS\.eta"):
        CPS(eta=1.5)
    with pytest.raises(ConfigError, match="log_prob_form"):
        CPS(log_prob_form="sum")
    with pytest.raises(ConfigError, match="unknown SDE strategy"):
        build_strategy("ddim")


def test_registry():
    assert set(STRATEGIES) == {"flow", "cps", "dance", "ode"}
    for name, cls in STRATEGIES.items():
        assert cls.name == name
    built = build_strategy("cps", eta=0.5, log_prob_form="gaussian")
    assert built == CPS(eta=0.5, log_prob_form="gaussian")
    assert [cls.provides_log_prob for cls in (FlowSDE, DanceSDE, CPS, ODE)] == [
        True,
        True,
        True,
        False,
    ]


@pytest.mark.parametrize("strategy", [s for _, s, _ in CASES], ids=repr)
def test_replayed_log_prob_differentiates_through_velocity_only(strategy):
    v, x, _ = _inputs(8)
    sampled = strategy.step(v, x, SIGMAS[2], SIGMAS[3], generator=torch.Generator().manual_seed(0))
    v_train = v.clone().requires_grad_(True)
    prev = sampled.next_latents.clone().requires_grad_(True)
    out = strategy.step(v_train, x, SIGMAS[2], SIGMAS[3], prev_sample=prev)
    out.log_prob.sum().backward()
    assert v_train.grad is not None and bool(torch.isfinite(v_train.grad).all())
    assert float(v_train.grad.abs().sum()) > 0.0
    assert prev.grad is None  # x' is data


def test_library_imports_stay_below_models():
    """unirl.sde must not pull in diffusers/transformers/peft/ray or any layer above it."""
    import subprocess
    import sys

    upper = ("models", "algorithms", "train", "rollout", "reward", "trainer", "distributed")
    code = (
        "import sys, unirl.sde; "
        "heavy = ('diffusers', 'transformers', 'peft', 'ray'); "
        f"upper = {upper!r}; "
        "bad = [m for m in sys.modules if m.split('.')[0] in heavy"
        " or (m.startswith('unirl.') and m.split('.')[1] in upper)]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
