"""The pure losses of ``unirl.algorithms.losses`` vs independent float64 loop implementations
of docs/math.md (tolerance 1e-6), their edge cases and their gradients."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.algorithms.losses import (
    aggregate,
    clipped_surrogate,
    drpo_loss,
    flow_dppo_loss,
    gaussian_mean_kl,
    grpo_clip_loss,
    grpo_guard_log_ratio,
    k3_kl,
    pad_packed,
)

TOL = 1e-6


def _rand(shape, seed, scale=1.0):
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- GRPO clip
def _ref_clip(lp, old, adv, lo, hi):
    out, ratios = [], []
    for a, b, A in zip(lp.double().tolist(), old.double().tolist(), adv.double().tolist()):
        r = math.exp(a - b)
        rc = min(max(r, 1 - lo), 1 + hi)
        out.append(max(-A * r, -A * rc))
        ratios.append(r)
    return torch.tensor(out, dtype=torch.float64), torch.tensor(ratios, dtype=torch.float64)


@pytest.mark.parametrize("lo,hi", [(0.2, 0.2), (0.2, 0.28), (1e-4, 1e-4)])
def test_grpo_clip_loss_matches_reference(lo: float, hi: float) -> None:
    lp, old = _rand(64, 0, 0.3), _rand(64, 1, 0.3)
    adv = _rand(64, 2)
    terms, ratio = grpo_clip_loss(lp, old, adv, lo, hi)
    ref_terms, ref_ratio = _ref_clip(lp, old, adv, lo, hi)
    torch.testing.assert_close(terms.double(), ref_terms, atol=TOL, rtol=TOL)
    torch.testing.assert_close(ratio.double(), ref_ratio, atol=TOL, rtol=TOL)


def test_clip_higher_is_asymmetric() -> None:
    # r = 1.25 with A > 0: clipped (no gradient) under ε = 0.2, free under ε_high = 0.28.
    lp = torch.tensor([math.log(1.25), math.log(0.75)], requires_grad=True)
    old = torch.zeros(2)
    adv = torch.tensor([1.0, -1.0])
    sym, _ = grpo_clip_loss(lp, old, adv, 0.2, 0.2)
    asym, _ = grpo_clip_loss(lp, old, adv, 0.2, 0.28)
    assert sym[0].item() == pytest.approx(-1.2, abs=1e-6)
    assert asym[0].item() == pytest.approx(-1.25, abs=1e-6)
    # r = 0.75 with A < 0 hits the *low* side in both (ε_low = 0.2): loss 0.8, no gradient
    assert sym[1].item() == pytest.approx(0.8, abs=1e-6) and asym[1].item() == pytest.approx(
        0.8, abs=1e-6
    )
    (g_sym,) = torch.autograd.grad(sym.sum(), lp)
    (g_asym,) = torch.autograd.grad(asym.sum(), lp)
    assert g_sym.tolist() == [0.0, 0.0]
    assert g_asym[0].item() == pytest.approx(-1.25, abs=1e-6) and g_asym[1].item() == 0.0


def test_clipped_surrogate_is_the_plain_flowgrpo_formula_bit_for_bit() -> None:
    ratio, adv = torch.exp(_rand(50, 3, 1e-4)), _rand(50, 4)
    eps = 1e-4
    expected = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - eps, 1.0 + eps))
    assert torch.equal(clipped_surrogate(ratio, adv, eps, eps), expected)


# ----------------------------------------------------------------------------- Flow-DPPO
def _ref_dppo(lp, old, adv, mn, mo, std, tau):
    """Loops in float64: returns (loss, keep list, D list)."""
    kept_vals, keep, ds = [], [], []
    for i in range(lp.shape[0]):
        diffs = (mn[i].double() - mo[i].double()).reshape(-1).tolist()
        d = sum(x * x for x in diffs) / len(diffs) / (2 * float(std[i]) ** 2)
        lr = float(lp[i].double() - old[i].double())
        r, a = math.exp(lr), float(adv[i])
        directional = (r > 1 and a > 0) or (r < 1 and a < 0)
        k = not (d >= tau and directional)
        keep.append(k)
        ds.append(d)
        if k:
            kept_vals.append(-a * r)
    loss = sum(kept_vals) / len(kept_vals) if kept_vals else 0.0
    return loss, keep, ds


def _dppo_inputs(seed: int, b: int = 40):
    lp, old = _rand(b, seed, 0.05), _rand(b, seed + 1, 0.05)
    adv = _rand(b, seed + 2)
    mo = _rand((b, 2, 3, 3), seed + 3)
    mn = mo + _rand((b, 2, 3, 3), seed + 4, 0.01) * torch.rand(
        b, 1, 1, 1, generator=torch.Generator().manual_seed(seed)
    )
    std = 0.05 + torch.rand(b, generator=torch.Generator().manual_seed(seed + 5))
    return lp, old, adv, mn, mo, std


def test_flow_dppo_loss_matches_reference_on_random_mixed_terms() -> None:
    lp, old, adv, mn, mo, std = _dppo_inputs(10)
    d = gaussian_mean_kl(mn, mo, std).sort().values
    tau = float(d[len(d) // 2 - 1] + d[len(d) // 2]) / 2  # between two terms: no fp32/fp64 tie
    out = flow_dppo_loss(lp, old, adv, mn, mo, std, tau)
    ref_loss, ref_keep, ref_d = _ref_dppo(lp, old, adv, mn, mo, std, tau)
    torch.testing.assert_close(
        out.kl.double(), torch.tensor(ref_d, dtype=torch.float64), atol=TOL, rtol=TOL
    )
    assert out.keep.tolist() == ref_keep
    assert 0 < sum(ref_keep) < len(ref_keep), "the case must mix kept and dropped terms"
    assert abs(out.loss.item() - ref_loss) < TOL


def test_gaussian_mean_kl_matches_reference() -> None:
    mn, mo = _rand((3, 2, 4, 4), 0), _rand((3, 2, 4, 4), 1)
    std = torch.tensor([0.1, 0.5, 2.0])
    ref = [
        ((mn[i].double() - mo[i].double()) ** 2).mean().item() / (2 * float(std[i]) ** 2)
        for i in range(3)
    ]
    torch.testing.assert_close(
        gaussian_mean_kl(mn, mo, std).double(),
        torch.tensor(ref, dtype=torch.float64),
        atol=TOL,
        rtol=TOL,
    )


def _edge_case_means(b: int, d_target: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Means whose D is d_target for every term (std 1, constant difference)."""
    mo = torch.zeros(b, 1, 2, 2)
    mn = mo + math.sqrt(2 * d_target)
    return mn, mo, torch.ones(b)


def test_flow_dppo_threshold_is_inclusive_exactly_at_tau() -> None:
    mn, mo, std = _edge_case_means(2, 1e-3)
    d = gaussian_mean_kl(mn, mo, std)
    tau = float(d[0])  # exactly the computed D
    lp, old, adv = torch.tensor([0.1, 0.1]), torch.zeros(2), torch.tensor([1.0, 1.0])
    at = flow_dppo_loss(lp, old, adv, mn, mo, std, tau)
    assert at.keep.tolist() == [False, False], (
        "D == τ and moving with A > 0 must be dropped (D ≥ τ)"
    )
    # the next fp32 value above τ (D is fp32, and so is the comparison)
    tau_up = float(torch.nextafter(torch.tensor(tau), torch.tensor(math.inf)))
    above = flow_dppo_loss(lp, old, adv, mn, mo, std, tau_up)
    assert above.keep.tolist() == [True, True]


def test_flow_dppo_direction_cases() -> None:
    # D ≥ τ for every term; only the direction decides
    mn, mo, std = _edge_case_means(7, 1.0)
    lp = torch.tensor([0.1, -0.1, 0.1, -0.1, 0.0, 0.0, 0.1], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0])
    # (r>1,A>0) drop, (r<1,A<0) drop, (r>1,A<0) keep, (r<1,A>0) keep, r=1 keep, r=1 keep, A=0 keep
    out = flow_dppo_loss(lp, torch.zeros(7), adv, mn, mo, std, 0.5)
    assert out.keep.tolist() == [False, False, True, True, True, True, True]
    kept = [2, 3, 4, 5, 6]
    expected = sum(-float(adv[i]) * math.exp(float(lp[i].detach())) for i in kept) / len(kept)
    assert abs(out.loss.item() - expected) < TOL
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert grad[0].item() == 0.0 and grad[1].item() == 0.0, "dropped terms pass no gradient"
    for i in kept:
        assert (
            abs(grad[i].item() - (-float(adv[i]) * math.exp(float(lp[i].detach())) / len(kept)))
            < TOL
        )


def test_flow_dppo_none_masked_is_plain_mean() -> None:
    lp, old, adv, mn, mo, std = _dppo_inputs(20)
    out = flow_dppo_loss(lp, old, adv, mn, mo, std, threshold=1e9)
    assert bool(out.keep.all())
    expected = (-adv.double() * torch.exp(lp.double() - old.double())).mean().item()
    assert abs(out.loss.item() - expected) < TOL


def test_flow_dppo_all_masked_gives_connected_zero() -> None:
    mn, mo, std = _edge_case_means(3, 1.0)
    lp = torch.tensor([0.2, 0.3, -0.4], requires_grad=True)
    adv = torch.tensor([1.0, 2.0, -1.0])
    out = flow_dppo_loss(lp, torch.zeros(3), adv, mn, mo, std, 1e-3)
    assert out.keep.sum().item() == 0
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    out.loss.backward()
    assert lp.grad is not None and lp.grad.tolist() == [0.0, 0.0, 0.0]


def test_flow_dppo_overflowing_masked_ratio_gives_no_nan() -> None:
    mn, mo, std = _edge_case_means(2, 1.0)
    lp = torch.tensor([200.0, 0.01], requires_grad=True)  # exp(200) = inf in fp32
    adv = torch.tensor([1.0, -1.0])
    out = flow_dppo_loss(lp, torch.zeros(2), adv, mn, mo, std, 1e-3)
    assert out.keep.tolist() == [False, True]
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all()
    assert lp.grad[0].item() == 0.0
    # the naive form (where after exp) is exactly what this guards against
    naive = torch.where(out.keep, -adv * torch.exp(lp), torch.zeros(2)).sum()
    (g,) = torch.autograd.grad(naive, lp)
    assert torch.isnan(g[0])


def test_flow_dppo_gradient_flows_through_ratio_only() -> None:
    lp, old, adv, mn, mo, std = _dppo_inputs(30)
    lp = lp.clone().requires_grad_(True)
    mn = mn.clone().requires_grad_(True)
    tau = float(gaussian_mean_kl(mn.detach(), mo, std).median())
    out = flow_dppo_loss(lp, old, adv, mn, mo, std, tau)
    g_lp, g_mn = torch.autograd.grad(out.loss, [lp, mn], allow_unused=True)
    n_kept = int(out.keep.sum())
    expected = torch.where(
        out.keep, -adv * torch.exp(lp.detach() - old) / n_kept, torch.zeros_like(lp)
    )
    torch.testing.assert_close(g_lp, expected, atol=TOL, rtol=TOL)
    assert g_mn is None, "the mask is a decision: D carries no gradient"


# ----------------------------------------------------------------------------- GRPO-Guard
def test_grpo_guard_log_ratio_matches_reference() -> None:
    lp, old = _rand(8, 0, 0.1), _rand(8, 1, 0.1)
    mn, mo = _rand((8, 2, 3, 3), 2), _rand((8, 2, 3, 3), 3)
    std = 0.1 + torch.rand(8, generator=torch.Generator().manual_seed(4))
    got = grpo_guard_log_ratio(lp, old, mn, mo, std)
    ref = []
    for i in range(8):
        d = ((mn[i].double() - mo[i].double()) ** 2).mean().item() / (2 * float(std[i]) ** 2)
        ref.append((float(lp[i]) - float(old[i]) + d) * float(std[i]))
    torch.testing.assert_close(
        got.double(), torch.tensor(ref, dtype=torch.float64), atol=TOL, rtol=TOL
    )


def test_grpo_guard_recentres_the_gaussian_log_ratio() -> None:
    """For x' = μ_old + σ·z, (log r + D)·σ = mean(z·Δμ): the −D shift is gone and σ cancels."""
    b = 6
    mo = _rand((b, 2, 4, 4), 0).double()
    mn = mo + 0.05 * _rand((b, 2, 4, 4), 1).double()
    std = torch.tensor([0.05, 0.1, 0.2, 0.4, 0.8, 1.6], dtype=torch.float64)
    z = _rand((b, 2, 4, 4), 2).double()
    x = mo + std.view(-1, 1, 1, 1) * z

    def logp(mu):
        return (
            (
                -((x - mu) ** 2) / (2 * std.view(-1, 1, 1, 1) ** 2)
                - torch.log(std.view(-1, 1, 1, 1))
                - 0.5 * math.log(2 * math.pi)
            )
            .reshape(b, -1)
            .mean(1)
        )

    guarded = grpo_guard_log_ratio(logp(mn), logp(mo), mn, mo, std)
    expected = (z * (mn - mo)).reshape(b, -1).mean(1)
    torch.testing.assert_close(guarded, expected, atol=1e-10, rtol=1e-10)
    plain = logp(mn) - logp(mo)
    assert not torch.allclose(plain, expected, atol=1e-3), "the plain log-ratio is shifted/scaled"


# ----------------------------------------------------------------------------- DRPO
@pytest.mark.parametrize("adaptive", [False, True])
def test_drpo_loss_matches_reference(adaptive: bool) -> None:
    lp = _rand(50, 0, 0.3) - 1.0
    old = _rand(50, 1, 0.3) - 1.0
    adv = _rand(50, 2)
    eps = 0.2
    terms, ratio = drpo_loss(lp, old, adv, eps, adaptive)
    ref = []
    for a, b, A in zip(lp.double().tolist(), old.double().tolist(), adv.double().tolist()):
        r = math.exp(a - b)
        w = math.exp(b) if adaptive else 1.0
        ref.append(-A * r + abs(A) * w * (r - 1) ** 2 / (2 * eps))
    torch.testing.assert_close(
        terms.double(), torch.tensor(ref, dtype=torch.float64), atol=TOL, rtol=TOL
    )
    torch.testing.assert_close(
        ratio.double(), torch.exp(lp.double() - old.double()), atol=TOL, rtol=TOL
    )


@pytest.mark.parametrize("adaptive", [False, True])
def test_drpo_optimum_is_one_plus_eps_over_weight(adaptive: bool) -> None:
    eps = 0.2
    old = torch.tensor([math.log(0.5), math.log(0.25)])
    adv = torch.tensor([1.5, -2.0])
    w = old.exp() if adaptive else torch.ones(2)
    r_star = 1 + eps * torch.sign(adv) / w
    lp = (torch.log(r_star) + old).clone().requires_grad_(True)
    terms, _ = drpo_loss(lp, old, adv, eps, adaptive)
    (g,) = torch.autograd.grad(terms.sum(), lp)
    assert g.abs().max().item() < 1e-5
    # the old weight is detached: no gradient reaches old_log_prob through w
    old_g = old.clone().requires_grad_(True)
    terms2, _ = drpo_loss(lp.detach(), old_g, adv, eps, adaptive)
    (g_old,) = torch.autograd.grad(terms2.sum(), old_g)
    r = torch.exp(lp.detach() - old)
    expected = adv * r - adv.abs() * w * (r - 1) * r / eps  # d/d old of terms through r only
    torch.testing.assert_close(g_old, expected, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- k3 and aggregation
def test_k3_kl_matches_reference_and_is_nonnegative() -> None:
    p, q = _rand(40, 0, 0.5), _rand(40, 1, 0.5)
    ref = [math.exp(b - a) - (b - a) - 1 for a, b in zip(p.double().tolist(), q.double().tolist())]
    got = k3_kl(p, q)
    torch.testing.assert_close(
        got.double(), torch.tensor(ref, dtype=torch.float64), atol=TOL, rtol=TOL
    )
    assert (got >= 0).all() and k3_kl(p, p).abs().max().item() == 0.0


def _ragged_mask() -> torch.Tensor:
    lengths = [5, 2, 0, 7, 3]
    mask = torch.zeros(5, 8, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, 1 : 1 + n] = True
    return mask


def _ref_aggregate(
    terms: torch.Tensor, mask: torch.Tensor, mode: str, norm: int | None = None
) -> float:
    rows = [
        [float(terms[i, j]) for j in range(terms.shape[1]) if mask[i, j]]
        for i in range(terms.shape[0])
    ]
    if mode == "token-mean":
        flat = [x for r in rows for x in r]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-mean":
        means = [sum(r) / len(r) for r in rows if r]
        return sum(means) / len(means)
    return sum(sum(r) / norm for r in rows) / len(rows)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregate_modes_match_reference(mode: str) -> None:
    terms = _rand((5, 8), 0).double().float().requires_grad_(True)
    mask = _ragged_mask()
    got = aggregate(terms, mask, mode, norm_length=16)
    assert abs(got.item() - _ref_aggregate(terms.detach(), mask, mode, 16)) < TOL
    (g,) = torch.autograd.grad(got, terms)
    assert (g[~mask] == 0).all(), "masked positions pass no gradient"


def test_aggregate_modes_differ_and_validate() -> None:
    terms, mask = _rand((5, 8), 1), _ragged_mask()
    values = {
        m: aggregate(terms, mask, m, norm_length=16).item()
        for m in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    }
    assert len({round(v, 6) for v in values.values()}) == 3
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(terms, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(terms, mask, "sum")
    empty = aggregate(terms.requires_grad_(True), torch.zeros_like(mask), "seq-mean-token-mean")
    assert empty.item() == 0.0 and empty.requires_grad


def test_aggregate_ignores_inf_at_masked_positions() -> None:
    terms = torch.zeros(2, 3, requires_grad=True)
    big = terms + torch.tensor([[0.0, float("inf"), 1.0], [2.0, 0.0, float("nan")]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    loss = aggregate(big, mask, "token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(0.75)
    assert torch.isfinite(terms.grad).all()


def test_pad_packed() -> None:
    values = torch.arange(6.0)
    offsets = torch.tensor([0, 2, 2, 6])
    out = pad_packed(values, offsets, fill=-1.0)
    assert out.tolist() == [[0.0, 1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0], [2.0, 3.0, 4.0, 5.0]]
