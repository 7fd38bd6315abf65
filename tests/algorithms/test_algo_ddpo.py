"""DDPO (importance-sampled and score-function) and DPOK on the tiny stand-in family: loss and
gradients equal a float64 write-out of each formula (docs/math.md) to 1e-6, on- and off-policy."""

from __future__ import annotations

import math

import pytest
import torch
from flow_fakes import anchor, make_pipeline, perturbed, sample, sgd_step, update, zero_grad

from unirl.algorithms import DDPO, DPOK, KLConfig
from unirl.config import ConfigError
from unirl.train.stack import TrainStack

ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])
LOSS_TOL = 1e-6
GRAD_RTOL = 1e-6  # ‖g − g_ref‖ / ‖g_ref‖ over every trainable parameter


def _velocity(x: torch.Tensor, sigma: torch.Tensor, embeds: torch.Tensor, ws) -> torch.Tensor:
    """TinyBundle's v = conv1x1(x)·(1 + σ) + W·mean(embeds) + b, in the weights' dtype."""
    cw, cb, lw, lb = ws
    conv = torch.einsum("oi,bihw->bohw", cw[:, :, 0, 0], x) + cb[None, :, None, None]
    shift = embeds.mean(dim=1) @ lw.T + lb
    return conv * (1.0 + sigma.view(-1, 1, 1, 1)) + shift[:, :, None, None]


def _flow_step(seg, k: int, embeds: torch.Tensor, ws, eta: float):
    """Slot ``k`` of every sample in float64, FlowSDE of docs/math.md (no CFG):
    ``(log p(x' | x)[B], μ[B, C, h, w], σ_t[B])``."""
    b = (-1, 1, 1, 1)
    sig_all = seg.sigmas.double()
    idx = seg.sde_indices[:, k]
    sig, nxt = sig_all[idx], sig_all[idx + 1]
    x, x_next = seg.latents[:, k].double(), seg.next_latents[:, k].double()
    v = _velocity(x, sig, embeds, ws)
    denom = torch.where(sig == 1.0, torch.full_like(sig, float(seg.sigmas[1])), sig)
    s = eta * torch.sqrt(sig / (1.0 - denom))
    mean = x + (v + (s.square() / (2 * sig)).view(b) * (x + (1 - sig).view(b) * v)) * (
        nxt - sig
    ).view(b)
    std = s * torch.sqrt(sig - nxt)
    logp = (
        -((x_next - mean) ** 2) / (2 * std.view(b) ** 2)
        - torch.log(std).view(b)
        - 0.5 * math.log(2 * math.pi)
    ).mean(dim=(1, 2, 3))
    return logp, mean, std


def _float64_reference(
    pipeline,
    prepared,
    *,
    estimator: str,
    clip: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    ref_weights=None,
) -> tuple[float, list[torch.Tensor]]:
    """The loss of one optimizer step written out: per micro-batch (weight = its share of the
    samples), the mean over trained steps of α·mean_i ℓ_i + β·mean_i KL_i, with
    ℓ = max(−A·r, −A·clip(r, 1 ± ε)) (importance) or −A·log p (score function) and
    KL = mean ‖μ_θ − μ_ref‖² / (2σ_t²). Returns (loss, gradients of every weight)."""
    weights = [p.detach().double().requires_grad_(True) for p in pipeline.bundle.parameters()]
    eta = pipeline.strategy.eta
    n = sum(len(a) for _, _, a in prepared)
    total = torch.zeros((), dtype=torch.float64)
    for cond, seg, adv in prepared:
        a = adv.double()
        embeds = cond.embeds.double()
        num = seg.num_sde_steps
        for k in range(num):
            logp, mean, std = _flow_step(seg, k, embeds, weights, eta)
            if estimator == "importance":
                ratio = torch.exp(logp - seg.sde_logp[:, k].double())
                term = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
            else:
                term = -a * logp
            step = alpha * term.mean()
            if beta > 0:
                _, ref_mean, _ = _flow_step(seg, k, embeds, ref_weights, eta)
                kl = (mean - ref_mean).reshape(len(a), -1).square().mean(1) / (2 * std**2)
                step = step + beta * kl.mean()
            total = total + step * (len(a) / n / num)
    total.backward()
    return float(total.detach()), [w.grad for w in weights]


def _relative_gap(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    diff = torch.cat([(a.double() - b).flatten() for a, b in zip(ours, ref, strict=True)])
    return float(diff.norm() / torch.cat([b.flatten() for b in ref]).norm())


def _grads(pipeline) -> list[torch.Tensor]:
    return [p.grad.clone() for p in pipeline.bundle.parameters()]


# ----------------------------------------------------------------------------- DDPO
def test_ddpo_importance_equals_float64_clipped_ratio_off_policy() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = DDPO(pipeline=pipeline, clip_range=3e-4)
    prepared = anchor(algo, conditions, segment, 2, ADV)
    _, first = update(algo, prepared)
    assert float((first["ratio"] - 1).abs().max()) == 0.0  # π_old replayed: on-policy, exactly 1
    sgd_step(pipeline.bundle, lr=0.05)  # off-policy: the ratio and the clip matter
    loss, terms = update(algo, prepared)
    metrics = algo.summarize(terms)
    assert 0 < metrics["clipfrac/above"] + metrics["clipfrac/below"] < 1, "some clipped, some not"
    ref_loss, ref_grads = _float64_reference(pipeline, prepared, estimator="importance", clip=3e-4)
    assert abs(float(loss) - ref_loss) <= LOSS_TOL
    assert _relative_gap(_grads(pipeline), ref_grads) <= GRAD_RTOL
    # the unclipped formula is a different loss: the test can tell
    _, unclipped = _float64_reference(pipeline, prepared, estimator="importance", clip=1.0)
    assert _relative_gap(_grads(pipeline), unclipped) > 1e-2


def test_ddpo_score_function_equals_float64_reinforce() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = DDPO(pipeline=pipeline, estimator="score_function")
    prepared = anchor(algo, conditions, segment, 2, ADV)
    loss, terms = update(algo, prepared)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    ref_loss, ref_grads = _float64_reference(pipeline, prepared, estimator="score_function")
    assert abs(float(loss) - ref_loss) <= LOSS_TOL
    assert _relative_gap(_grads(pipeline), ref_grads) <= GRAD_RTOL
    # still the same formula a step later: −A·log p of the current weights, no π_old
    sgd_step(pipeline.bundle, lr=0.05)
    loss, _ = update(algo, prepared)
    ref_loss, ref_grads = _float64_reference(pipeline, prepared, estimator="score_function")
    assert abs(float(loss) - ref_loss) <= LOSS_TOL
    assert _relative_gap(_grads(pipeline), ref_grads) <= GRAD_RTOL


def test_score_function_gradient_is_the_importance_gradient_on_policy() -> None:
    """∇(−A·r) at r = 1 is −A·∇log p: the two estimators agree on the first update."""
    grads = {}
    for estimator in ("importance", "score_function"):
        pipeline = make_pipeline()
        conditions, segment = sample(pipeline)
        algo = DDPO(pipeline=pipeline, estimator=estimator, clip_range=1e-4)
        update(algo, anchor(algo, conditions, segment, 2, ADV))
        grads[estimator] = _grads(pipeline)
    assert _relative_gap(grads["score_function"], [g.double() for g in grads["importance"]]) <= 1e-6
    assert float(torch.cat([g.flatten() for g in grads["importance"]]).norm()) > 1e-3


def test_score_function_is_on_policy_only_and_knobs_are_validated() -> None:
    pipeline = make_pipeline()
    sf = DDPO(pipeline=pipeline, estimator="score_function")
    with pytest.raises(ConfigError, match="num_updates_per_batch=1"):
        TrainStack(backend=None, algorithm=sf, num_updates_per_batch=2)
    with pytest.raises(ConfigError, match=r"algorithm\.estimator"):
        DDPO(pipeline=pipeline, estimator="reinforce")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="clip_range"):
        DDPO(pipeline=pipeline, clip_range=0.0)


# ----------------------------------------------------------------------------- DPOK
@pytest.mark.parametrize("estimator", ["score_function", "importance"])
def test_dpok_equals_float64_policy_gradient_plus_gaussian_kl(estimator: str) -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = DPOK(
        pipeline=pipeline,
        kl=KLConfig(beta=0.3),
        policy_weight=2.0,
        estimator=estimator,
        clip_range=3e-4,
    )
    algo.bind_reference(lambda: perturbed(pipeline.bundle))
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    # the stand-in reference is "the current weights + fixed noise": read it as the loss will
    with perturbed(pipeline.bundle):
        ref_weights = [p.detach().double().clone() for p in pipeline.bundle.parameters()]
    loss, terms = update(algo, prepared)
    assert float(terms["kl"].min()) > 0
    ref_loss, ref_grads = _float64_reference(
        pipeline,
        prepared,
        estimator=estimator,
        clip=3e-4,
        alpha=2.0,
        beta=0.3,
        ref_weights=ref_weights,
    )
    assert abs(float(loss) - ref_loss) <= LOSS_TOL
    assert _relative_gap(_grads(pipeline), ref_grads) <= GRAD_RTOL
    zero_grad(pipeline.bundle)
    _, no_kl = _float64_reference(
        pipeline, prepared, estimator=estimator, clip=3e-4, alpha=2.0, beta=0.0
    )
    update(algo, prepared)
    assert _relative_gap(_grads(pipeline), no_kl) > 1e-3, "β·KL must move the gradient"
    assert "kl_loss" in algo.summarize(terms)


def test_dpok_needs_a_kl_and_a_positive_alpha() -> None:
    pipeline = make_pipeline()
    with pytest.raises(ConfigError, match=r"algorithm\.kl\.beta > 0"):
        DPOK(pipeline=pipeline)
    with pytest.raises(ConfigError, match="policy_weight"):
        DPOK(pipeline=pipeline, kl=KLConfig(beta=0.1), policy_weight=0.0)
