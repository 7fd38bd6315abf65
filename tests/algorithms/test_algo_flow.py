"""FlowGRPO (incl. GRPO-Guard) and FlowDPPO on a tiny stand-in family driven by the real
denoise loop: on-policy exactness, bf16 storage, σ_t from the strategy, loss values."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from flow_fakes import (
    anchor,
    make_pipeline,
    perturbed,
    run_update,
    sample,
    sgd_step,
    update,
    zero_grad,
)

from unirl.algorithms import FlowDPPO, FlowGRPO, KLConfig
from unirl.config import ConfigError
from unirl.sde import CPS, DanceSDE, FlowSDE

ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])
TOL = 1e-6


def _std_independent(strategy, sigma: float, sigma_next: float, sigma_max: float) -> float:
    """Each kernel's step std written out from docs/math.md (not through the strategy object)."""
    if isinstance(strategy, FlowSDE):
        denom = sigma_max if sigma == 1.0 else sigma
        return strategy.eta * math.sqrt(sigma / (1 - denom)) * math.sqrt(sigma - sigma_next)
    if isinstance(strategy, DanceSDE):
        return strategy.eta * math.sqrt(sigma - sigma_next)
    return sigma_next * math.sin(strategy.eta * math.pi / 2)


def _slot_std(strategy, segment, k: int) -> torch.Tensor:
    sig = segment.sigmas.double().tolist()
    return torch.tensor(
        [
            _std_independent(strategy, sig[j], sig[j + 1], sig[1])
            for j in segment.sde_indices[:, k].tolist()
        ],
        dtype=torch.float64,
    )


def _independent_d(pipeline, prepared) -> torch.Tensor:
    """D per term in the order the algorithms emit terms (micro-batch, then slot, then sample)."""
    out = []
    for cond, seg, _ in prepared:
        for k in range(seg.num_sde_steps):
            with torch.no_grad():
                mean = pipeline.replay(cond, seg, k).mean.double()
            diff = (mean - seg.sde_means[:, k].double()).reshape(len(mean), -1)
            out.append(diff.square().mean(1) / (2 * _slot_std(pipeline.strategy, seg, k) ** 2))
    return torch.cat(out)


# ----------------------------------------------------------------------------- on-policy exactness
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_flowdppo_first_step_ratio_one_and_kl_zero(guidance: float) -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline, guidance_scale=guidance)
    algo = FlowDPPO(pipeline=pipeline, kl_threshold=1e-12)
    terms = run_update(algo, conditions, segment, micro=2, advantages=ADV)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    assert float(terms["dppo_kl"].abs().max()) == 0.0
    assert bool(terms["keep"].all())
    metrics = algo.summarize(terms)
    assert metrics["dppo_kl/max"] == 0.0 and metrics["mask/dropped"] == 0.0
    grads = [p.grad for p in pipeline.bundle.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().max()) > 0 for g in grads), "the on-policy step must still train"


@pytest.mark.parametrize("ratio_norm", ["none", "grpo_guard"])
def test_flowgrpo_first_ratio_exactly_one(ratio_norm: str) -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = FlowGRPO(pipeline=pipeline, ratio_norm=ratio_norm)
    terms = run_update(algo, conditions, segment, micro=2, advantages=ADV)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    assert algo.summarize(terms)["approx_kl"] == 0.0


@pytest.mark.parametrize(
    "make_algo",
    [
        lambda p: FlowGRPO(pipeline=p, old_logp_source="rollout"),
        lambda p: FlowGRPO(pipeline=p, old_logp_source="rollout", ratio_norm="grpo_guard"),
        lambda p: FlowDPPO(pipeline=p, old_logp_source="rollout"),
    ],
    ids=["flowgrpo", "grpo_guard", "flowdppo"],
)
def test_bf16_stored_trajectory_gives_ratio_exactly_one(make_algo) -> None:
    """The rollout's own log-probs (not a replayed anchor) match replay bit for bit in bf16,
    because x' is rounded to bf16 before its log-prob is taken."""
    pipeline = make_pipeline(storage_dtype="bf16", record_means=True)
    same_steps = torch.tensor([[0, 1, 2]] * 4)
    conditions, segment = sample(pipeline, sde_indices=same_steps)
    assert segment.latents.dtype == torch.bfloat16 and segment.next_latents.dtype == torch.bfloat16
    algo = make_algo(pipeline)
    terms = run_update(algo, conditions, segment, micro=4, advantages=ADV)  # rollout geometry
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    if "dppo_kl" in terms:
        assert float(terms["dppo_kl"].max()) == 0.0


# ----------------------------------------------------------------------------- FlowDPPO numerics
@pytest.mark.parametrize(
    "strategy",
    [FlowSDE(eta=0.7), DanceSDE(eta=0.3), CPS(eta=0.8, log_prob_form="gaussian")],
    ids=["flow", "dance", "cps"],
)
def test_flowdppo_sigma_t_comes_from_the_strategy(strategy) -> None:
    pipeline = make_pipeline(strategy)
    conditions, segment = sample(pipeline)
    algo = FlowDPPO(pipeline=pipeline, kl_threshold=1e-5)
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    _, terms = update(algo, prepared)  # off-policy now: same anchors, new weights
    expected = _independent_d(pipeline, prepared)
    assert float(expected.min()) > 0
    torch.testing.assert_close(terms["dppo_kl"].double(), expected, atol=0.0, rtol=1e-5)


def test_flowdppo_masks_and_loss_after_an_update() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline, n=8)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 1.5])
    prepared = anchor(FlowDPPO(pipeline=pipeline), conditions, segment, 4, adv)
    algo = FlowDPPO(pipeline=pipeline, kl_threshold=1e-5)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    d = _independent_d(pipeline, prepared)
    algo.kl_threshold = float(d.median())  # half the terms are over τ
    zero_grad(pipeline.bundle)
    loss, terms = update(algo, prepared)
    keep, over, directional = terms["keep"], terms["over"], terms["directional"]
    lr, a = terms["log_ratio"].double(), terms["adv"].double()
    exp_dir = ((lr > 0) & (a > 0)) | ((lr < 0) & (a < 0))
    assert torch.equal(directional, exp_dir)
    assert torch.equal(keep, ~(over & exp_dir))
    assert 0 < int((~keep).sum()) < keep.numel()
    # loss = Σ_micro (n_mb/n) · mean_k [ mean over kept terms of −A·r ]
    r = torch.exp(lr)
    expected, pos, num_micro, per_micro = 0.0, 0, len(prepared), 4
    for _, seg, _ in prepared:
        steps = []
        for _ in range(seg.num_sde_steps):
            sl = slice(pos, pos + per_micro)
            kept = keep[sl]
            vals = (-a[sl] * r[sl])[kept]
            steps.append(float(vals.sum() / max(int(kept.sum()), 1)))
            pos += per_micro
        expected += sum(steps) / len(steps) / num_micro
    assert abs(loss - expected) < TOL
    metrics = algo.summarize(terms)
    assert metrics["mask/dropped"] == pytest.approx(float((~keep).float().mean()))
    assert metrics["mask/dropped_pos"] + metrics["mask/dropped_neg"] == pytest.approx(
        metrics["mask/dropped"]
    )
    assert metrics["mask/over_threshold"] == pytest.approx(
        metrics["mask/dropped"] + metrics["mask/spared_by_direction"]
    )
    assert metrics["dppo_kl/max"] == pytest.approx(float(d.max()), rel=1e-5)


def test_flowdppo_kl_to_reference() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = FlowDPPO(pipeline=pipeline, kl=KLConfig(beta=0.1))
    with pytest.raises(RuntimeError, match="reference"):
        run_update(algo, conditions, segment, 2, ADV)
    zero_grad(pipeline.bundle)
    algo.bind_reference(lambda: perturbed(pipeline.bundle))
    terms = run_update(algo, conditions, segment, 2, ADV)
    assert float(terms["kl"].min()) > 0 and "kl_loss" in algo.summarize(terms)


def test_flowdppo_rollout_source_needs_means() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    with pytest.raises(ValueError, match="record_means"):
        FlowDPPO(pipeline=pipeline, old_logp_source="rollout").prepare_segment(conditions, segment)
    with pytest.raises(ConfigError, match="kl_threshold"):
        FlowDPPO(pipeline=pipeline, kl_threshold=0.0)


# ----------------------------------------------------------------------------- FlowGRPO
def _original_flowgrpo(
    pipeline, prepared, clip: float, kl_beta: float, reference
) -> list[torch.Tensor]:
    """The pre-refactor FlowGRPO step written out: per slot ratio, clip, optional KL, backward."""
    n = sum(len(a) for _, _, a in prepared)
    for cond, seg, adv in prepared:
        sigmas = seg.sigmas.float()
        for k in range(seg.num_sde_steps):
            if kl_beta > 0:
                with torch.no_grad(), reference():
                    ref = pipeline.replay(cond, seg, k)
            rec = pipeline.replay(cond, seg, k)
            ratio = torch.exp(rec.log_prob - seg.sde_logp[:, k])
            policy = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
            loss = policy.mean()
            if kl_beta > 0:
                idx = seg.sde_indices[:, k]
                kl = pipeline.strategy.kl(
                    rec.mean,
                    ref.mean,
                    sigmas[idx],
                    sigmas[idx + 1],
                    "gaussian",
                    sigma_max=float(sigmas[1]),
                )
                loss = loss + kl_beta * kl.mean()
            (loss * (len(adv) / n / seg.num_sde_steps)).backward()
    return [p.grad.clone() for p in pipeline.bundle.parameters()]


@pytest.mark.parametrize("kl_beta", [0.0, 0.04])
def test_flowgrpo_default_is_bit_for_bit_the_plain_loss(kl_beta: float) -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = FlowGRPO(pipeline=pipeline, clip_range=3e-4, kl=KLConfig(beta=kl_beta))
    algo.bind_reference(lambda: perturbed(pipeline.bundle))
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)  # move off-policy so clipping and the ratio matter
    _, terms = update(algo, prepared)
    metrics = algo.summarize(terms)
    assert 0 < metrics["clipfrac/above"] + metrics["clipfrac/below"] < 1, (
        "some terms clipped, some not"
    )
    ours = [p.grad.clone() for p in pipeline.bundle.parameters()]
    zero_grad(pipeline.bundle)
    theirs = _original_flowgrpo(
        pipeline, prepared, 3e-4, kl_beta, lambda: perturbed(pipeline.bundle)
    )
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_grpo_guard_ratio_and_step_weight() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = FlowGRPO(pipeline=pipeline, ratio_norm="grpo_guard", clip_range=1.0)
    prepared = anchor(algo, conditions, segment, 2, ADV)
    assert all(seg.sde_means is not None for _, seg, _ in prepared)  # GRPO-Guard anchors μ_old
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    loss, terms = update(algo, prepared)
    # independent: log r̃ = (log r + D)·σ_t, loss = mean_k mean_i −A·r̃ / (σ − σ')  (clip 1 is inactive)
    d = _independent_d(pipeline, prepared)
    stds, weights, advs = [], [], []
    for _, seg, adv in prepared:
        sig = seg.sigmas.double()
        for k in range(seg.num_sde_steps):
            stds.append(_slot_std(pipeline.strategy, seg, k))
            idx = seg.sde_indices[:, k]
            weights.append(1.0 / (sig[idx] - sig[idx + 1]))
            advs.append(adv.double())
    std, w, a = torch.cat(stds), torch.cat(weights), torch.cat(advs)
    guard_ratio = torch.exp((terms["log_ratio"].double() + d) * std)
    torch.testing.assert_close(terms["ratio"].double(), guard_ratio, atol=1e-7, rtol=0.0)
    assert float((terms["ratio"] - 1).abs().max()) > 0
    per_term = -a * guard_ratio * w
    s = prepared[0][1].num_sde_steps
    expected = sum(float(per_term[i * 2 * s : (i + 1) * 2 * s].mean()) / 2 for i in range(2))
    assert abs(loss - expected) < 1e-5


def test_grpo_guard_validation() -> None:
    with pytest.raises(ConfigError, match="log_prob_form"):
        FlowGRPO(pipeline=make_pipeline(CPS(eta=0.8)), ratio_norm="grpo_guard")
    with pytest.raises(ConfigError, match="ratio_norm"):
        FlowGRPO(pipeline=make_pipeline(), ratio_norm="guard")
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    with pytest.raises(ValueError, match="record_means"):
        FlowGRPO(
            pipeline=pipeline, ratio_norm="grpo_guard", old_logp_source="rollout"
        ).prepare_segment(conditions, segment)
    plain = anchor(FlowGRPO(pipeline=pipeline), conditions, segment, 2, ADV)
    assert all(seg.sde_means is None for _, seg, _ in plain)  # plain Flow-GRPO: log-probs only


# ----------------------------------------------------------------------------- CFG gradient
GUIDANCE = 3.0
# ‖g − g_ref‖ / ‖g_ref‖ over every trainable parameter, the fp32 code vs a float64 reference
# (measured 5.9e-7 for cond_only and 5.3e-7 for both: the fp32 floor of x' − μ over std²)
GRAD_RTOL = 1e-6


def _float64_flowgrpo_grads(
    pipeline, prepared, *, guidance: float, detach_uncond: bool
) -> list[torch.Tensor]:
    """Flow-GRPO's unclipped loss (clip_range=1 keeps every term inside 1 ± ε) written out in
    float64 from the TinyBundle formula, v = conv1x1(x)·(1 + σ) + W·mean(embeds) + b, with
    batched-CFG conditions [zeros; embeds] and the FlowSDE kernel of docs/math.md:
    v = v_u + g·(v_c − v_u), with v_u detached (flow_grpo) or not."""
    bundle = pipeline.bundle
    weights = [p.detach().double().requires_grad_(True) for p in bundle.parameters()]
    eta = pipeline.strategy.eta

    def velocity(x: torch.Tensor, sigma: torch.Tensor, embeds: torch.Tensor, ws) -> torch.Tensor:
        cw, cb, lw, lb = ws
        conv = torch.einsum("oi,bihw->bohw", cw[:, :, 0, 0], x) + cb[None, :, None, None]
        shift = embeds.mean(dim=1) @ lw.T + lb
        return conv * (1.0 + sigma.view(-1, 1, 1, 1)) + shift[:, :, None, None]

    n = sum(len(a) for _, _, a in prepared)
    total = torch.zeros((), dtype=torch.float64)
    for cond, seg, adv in prepared:
        sig_all = seg.sigmas.double()
        sigma_max = float(seg.sigmas[1])
        embeds = cond.embeds.double()
        for k in range(seg.num_sde_steps):
            idx = seg.sde_indices[:, k]
            sig, nxt = sig_all[idx], sig_all[idx + 1]
            x, x_next = seg.latents[:, k].double(), seg.next_latents[:, k].double()
            v_c = velocity(x, sig, embeds, weights)
            frozen = [w.detach() for w in weights] if detach_uncond else weights
            v_u = velocity(x, sig, torch.zeros_like(embeds), frozen)
            v = v_u + guidance * (v_c - v_u)
            denom = torch.where(sig == 1.0, torch.full_like(sig, sigma_max), sig)
            s = eta * torch.sqrt(sig / (1.0 - denom))
            b = (-1, 1, 1, 1)
            mean = x + (v + (s.square() / (2 * sig)).view(b) * (x + (1 - sig).view(b) * v)) * (
                nxt - sig
            ).view(b)
            std = s * torch.sqrt(sig - nxt)
            logp = (
                -((x_next - mean) ** 2) / (2 * std.view(b) ** 2)
                - torch.log(std).view(b)
                - 0.5 * math.log(2 * math.pi)
            ).mean(dim=(1, 2, 3))
            ratio = torch.exp(logp - seg.sde_logp[:, k].double())
            total = total + (-adv.double() * ratio).mean() * (len(adv) / n / seg.num_sde_steps)
    total.backward()
    return [w.grad for w in weights]


def _relative_gap(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    diff = torch.cat([(a.double() - b).flatten() for a, b in zip(ours, ref, strict=True)])
    return float(diff.norm() / torch.cat([b.flatten() for b in ref]).norm())


@pytest.mark.parametrize("cfg_gradient", ["cond_only", "both"])
def test_flowgrpo_cfg_gradient_matches_float64_formula(cfg_gradient: str) -> None:
    """``cond_only``: ∇v = g·∇v_c (flow_grpo's detached unconditional prediction); ``both``:
    ∇v = (1 − g)·∇v_u + g·∇v_c. Off-policy (after one step) so the ratio is not 1."""
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    algo = FlowGRPO(pipeline=pipeline, clip_range=1.0, cfg_gradient=cfg_gradient)
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    _, terms = update(algo, prepared)
    assert float((terms["ratio"] - 1).abs().max()) > 1e-4, "the step must be off-policy"
    ours = [p.grad.clone() for p in pipeline.bundle.parameters()]
    ref = _float64_flowgrpo_grads(
        pipeline, prepared, guidance=GUIDANCE, detach_uncond=cfg_gradient == "cond_only"
    )
    assert _relative_gap(ours, ref) <= GRAD_RTOL
    other = _float64_flowgrpo_grads(
        pipeline, prepared, guidance=GUIDANCE, detach_uncond=cfg_gradient == "both"
    )
    assert _relative_gap(ours, other) > 1e-2, "the two modes are different methods"


def test_flowgrpo_cfg_gradient_both_is_the_previous_batched_forward() -> None:
    """``both`` is the implementation before the knob: one batched [uncond; cond] forward
    with autograd through both halves, bit for bit."""
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    algo = FlowGRPO(pipeline=pipeline, clip_range=3e-4, cfg_gradient="both")
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    update(algo, prepared)
    ours = [p.grad.clone() for p in pipeline.bundle.parameters()]
    zero_grad(pipeline.bundle)
    theirs = _original_flowgrpo(pipeline, prepared, 3e-4, 0.0, None)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize(
    "make_algo",
    [lambda p: FlowGRPO(pipeline=p), lambda p: FlowDPPO(pipeline=p, kl_threshold=1e-12)],
    ids=["flowgrpo", "flowdppo"],
)
def test_cond_only_is_the_default_and_first_ratio_is_exactly_one(make_algo) -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    algo = make_algo(pipeline)
    assert algo.cfg_gradient == "cond_only"
    terms = run_update(algo, conditions, segment, micro=2, advantages=ADV)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))


def test_cfg_gradient_is_validated() -> None:
    with pytest.raises(ConfigError, match="cfg_gradient"):
        FlowGRPO(pipeline=make_pipeline(), cfg_gradient="uncond")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cfg_gradient"):
        FlowDPPO(pipeline=make_pipeline(), cfg_gradient="none")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- v_u reuse
class _Backend:
    """What the loss reads of the backend: the policy version (bumped per optimizer step)."""

    def __init__(self, version: int) -> None:
        self.policy_version = version


def _reuse_run(
    version: int, make_algo, *, moved: bool = False
) -> tuple[float, list[torch.Tensor], dict]:
    """Anchor and one update with the backend at ``version`` (the rollout is stamped 3);
    ``moved``: the weights change after anchoring while the version is left stale."""
    pipeline = make_pipeline(record_uncond=True, record_means=True)
    pipeline.bundle.policy_version = 3  # what the rollout is stamped with
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    assert segment.uncond_version == 3 and segment.sde_uncond.dtype == torch.float32
    algo = make_algo(pipeline)
    algo.backend = _Backend(version)
    prepared = anchor(algo, conditions, segment, 2, ADV)
    if moved:
        update(algo, prepared)
        sgd_step(pipeline.bundle, lr=0.05)
    loss, terms = update(algo, prepared)
    return (
        float(loss),
        [p.grad.clone() for p in pipeline.bundle.parameters()],
        algo.summarize(terms),
    )


@pytest.mark.parametrize(
    "make_algo",
    [lambda p: FlowGRPO(pipeline=p, clip_range=1.0), lambda p: FlowDPPO(pipeline=p)],
    ids=["flowgrpo", "flowdppo"],
)
def test_reused_uncond_equals_the_no_grad_recompute(make_algo) -> None:
    """Same version: v_u from the rollout; other version: the no-grad forward. On this family
    the two are bit-equal (fp32 storage), so loss and gradients are too."""
    loss_reused, grads_reused, m_reused = _reuse_run(3, make_algo)
    loss_recomputed, grads_recomputed, m_recomputed = _reuse_run(4, make_algo)
    assert m_reused["uncond_reused"] == 6.0 and m_reused["uncond_recomputed"] == 0.0
    assert m_recomputed["uncond_reused"] == 0.0 and m_recomputed["uncond_recomputed"] == 6.0
    assert loss_reused == loss_recomputed
    assert all(torch.equal(a, b) for a, b in zip(grads_reused, grads_recomputed, strict=True))
    # why the version is checked: a stale v_u after the weights moved is a different loss
    stale, _, _ = _reuse_run(3, make_algo, moved=True)
    fresh, _, _ = _reuse_run(4, make_algo, moved=True)
    assert stale != fresh


def test_reuse_is_refused_for_cfg_gradient_both_and_absent_without_record() -> None:
    with pytest.raises(ConfigError, match="record_uncond"):
        FlowGRPO(pipeline=make_pipeline(record_uncond=True), cfg_gradient="both")
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    assert segment.sde_uncond is None and segment.uncond_version == -1
    algo = FlowGRPO(pipeline=pipeline)
    algo.backend = _Backend(-1)
    metrics = algo.summarize(run_update(algo, conditions, segment, micro=2, advantages=ADV))
    assert "uncond_reused" not in metrics


# ----------------------------------------------------------------------------- slots per forward
SLOT_CASES: dict[str, tuple[Callable[[Any, int], Any], bool]] = {
    "flowgrpo_kl": (
        lambda p, g: FlowGRPO(
            pipeline=p, clip_range=3e-4, kl=KLConfig(beta=0.04), slots_per_forward=g
        ),
        False,
    ),
    "grpo_guard": (
        lambda p, g: FlowGRPO(
            pipeline=p, clip_range=1e-3, ratio_norm="grpo_guard", slots_per_forward=g
        ),
        False,
    ),
    "cfg_both": (
        lambda p, g: FlowGRPO(
            pipeline=p, clip_range=3e-4, cfg_gradient="both", slots_per_forward=g
        ),
        False,
    ),
    "flowdppo_kl": (
        lambda p, g: FlowDPPO(
            pipeline=p, kl_threshold=1e-6, kl=KLConfig(beta=0.04), slots_per_forward=g
        ),
        False,
    ),
    # v_u taken from the rollout (the version never moves here, so every replay reuses it)
    "flowgrpo_reuse": (
        lambda p, g: FlowGRPO(pipeline=p, clip_range=3e-4, slots_per_forward=g),
        True,
    ),
    "flowdppo_reuse": (
        lambda p, g: FlowDPPO(pipeline=p, kl_threshold=1e-6, slots_per_forward=g),
        True,
    ),
}
TERM_ATOL = 2**-23  # one float32 ulp at 1.0 (1.19e-7)


def _grouped_run(
    case: str, group: int
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], float]:
    """Anchor, update, one SGD step, update again (off-policy, so clipping, masks and the
    KL all act), on four trained slots with guidance; returns the second update's terms,
    gradients and loss."""
    make_algo, reuse = SLOT_CASES[case]
    pipeline = make_pipeline(record_uncond=reuse)
    pipeline.bundle.policy_version = 3
    indices = torch.tensor([[0, 1, 2, 3] if i % 4 < 2 else [1, 2, 3, 4] for i in range(4)])
    conditions, segment = sample(pipeline, steps=6, sde_indices=indices, guidance_scale=GUIDANCE)
    algo = make_algo(pipeline, group)
    algo.backend = _Backend(3)
    algo.bind_reference(lambda: perturbed(pipeline.bundle))
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    sgd_step(pipeline.bundle, lr=0.05)
    loss, terms = update(algo, prepared)
    return terms, [p.grad.clone() for p in pipeline.bundle.parameters()], float(loss)


@pytest.mark.parametrize("case", sorted(SLOT_CASES))
@pytest.mark.parametrize("group", [2, 3, 4])
def test_slots_per_forward_gives_the_one_slot_loss_and_gradients(case: str, group: int) -> None:
    """Several trained slots stacked as rows of one forward + backward (4 slots in groups of
    2, of 3 and 1, or all 4) is the same loss: every term, the loss and the gradient equal
    one slot per forward, to float32 rounding: the conv's batched rows differ from its
    smaller batches by at most an ulp of the O(1) log-probs, so every term is within
    ``TERM_ATOL`` (a log-ratio near 0 carries its log-probs' rounding) and the gradient
    within 1e-6 relative. Measured: at most 6.0e-8 and 5.4e-7. With ``reuse`` the stale
    rollout v_u of each slot must reach that slot's rows (a mix-up moves the loss after the
    SGD step). On GPUs the kernels' batch-size rounding (bf16) adds to this."""
    terms_1, grads_1, loss_1 = _grouped_run(case, 1)
    terms_g, grads_g, loss_g = _grouped_run(case, group)
    assert terms_1.keys() == terms_g.keys()
    for name in terms_1:
        assert terms_1[name].shape == terms_g[name].shape, name
        gap = float((terms_g[name].double() - terms_1[name].double()).abs().max())
        assert gap <= TERM_ATOL, f"{name}: {gap}"
    assert abs(loss_g - loss_1) <= TERM_ATOL  # a mean of O(1) terms that nearly cancel
    assert _relative_gap(grads_g, [g.double() for g in grads_1]) <= 1e-6
    assert float((terms_1["ratio"] - 1).abs().max()) > 1e-4, "the step must be off-policy"
    if SLOT_CASES[case][1]:
        assert bool(terms_g["uncond_reused"].all()) and len(terms_g["uncond_reused"]) == 8


class _RowCounter:
    """Wraps ``pipeline.replay``: the rows of every replay, in call order."""

    def __init__(self, pipeline: Any) -> None:
        self.rows: list[int] = []
        self.replay = pipeline.replay
        pipeline.replay = self

    def __call__(self, conditions: Any, segment: Any, slot: int, **kwargs: Any) -> Any:
        self.rows.append(len(segment))
        return self.replay(conditions, segment, slot, **kwargs)


@pytest.mark.parametrize("group", [2, 4])
def test_slots_per_forward_keeps_the_first_ratio_exactly_one_and_reuse(group: int) -> None:
    """The π_old anchor replays the same slot groups as the loss (the same rows per
    forward), so the first ratio is exactly 1; the rollout's v_u is still taken for every
    trained slot."""
    pipeline = make_pipeline(record_uncond=True)
    pipeline.bundle.policy_version = 3
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    algo = FlowGRPO(pipeline=pipeline, slots_per_forward=group)
    algo.backend = _Backend(3)
    counter = _RowCounter(pipeline)
    prepared = anchor(algo, conditions, segment, 2, ADV)
    anchored, counter.rows = counter.rows, []
    _, terms = update(algo, prepared)
    # 2 micro-batches of 2 samples, 3 trained slots: groups of 2 and 1, or one of 3
    assert anchored == counter.rows == ([4, 2] * 2 if group == 2 else [6] * 2)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    assert algo.summarize(terms)["uncond_reused"] == 6.0


def test_slots_per_forward_is_validated() -> None:
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="slots_per_forward"):
            FlowGRPO(pipeline=make_pipeline(), slots_per_forward=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="slots_per_forward"):
            FlowDPPO(pipeline=make_pipeline(), slots_per_forward=bad)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- π_old from the loss forward
class _ReplayCounter:
    """Wraps ``pipeline.replay``: how many times it was called."""

    def __init__(self, pipeline: Any) -> None:
        self.calls = 0
        self.replay = pipeline.replay
        pipeline.replay = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.replay(*args, **kwargs)


def _first_update(source: str, **knobs: Any) -> tuple[int, float, list[torch.Tensor], dict]:
    """Anchor and one update of a guided, KL-regularised Flow-GRPO with ``source``; returns
    the policy replays the whole thing ran, the loss, the gradients and the metrics."""
    pipeline = make_pipeline(record_uncond=True)
    pipeline.bundle.policy_version = 3
    conditions, segment = sample(pipeline, guidance_scale=GUIDANCE)
    algo = FlowGRPO(pipeline=pipeline, old_logp_source=source, **knobs)
    algo.backend = _Backend(3)
    algo.bind_reference(lambda: perturbed(pipeline.bundle))
    counter = _ReplayCounter(pipeline)
    loss, terms = update(algo, anchor(algo, conditions, segment, 2, ADV))
    grads = [p.grad.clone() for p in pipeline.bundle.parameters()]
    return counter.calls, float(loss), grads, algo.summarize(terms)


@pytest.mark.parametrize(
    "knobs",
    [
        {"kl": KLConfig(beta=0.04)},
        {"ratio_norm": "grpo_guard", "clip_range": 1e-5},
        {"slots_per_forward": 3},
    ],
    ids=["kl", "grpo_guard", "slots"],
)
def test_current_source_is_the_replayed_anchor_without_its_pass(knobs: dict) -> None:
    """``old_logp_source=current`` takes π_old from the loss forward: the loss, every gradient
    and the metrics equal ``replay``'s bit for bit (both ratios are exactly 1 on this family),
    with the anchor's forwards gone (2 micro-batches x 3 slots, KL reference replays aside)."""
    calls_replay, loss_replay, grads_replay, m_replay = _first_update("replay", **knobs)
    calls_current, loss_current, grads_current, m_current = _first_update("current", **knobs)
    slots = 3 // knobs.get("slots_per_forward", 1)
    assert calls_replay - calls_current == 2 * slots
    assert loss_current == loss_replay
    assert all(torch.equal(a, b) for a, b in zip(grads_current, grads_replay, strict=True))
    assert m_current == m_replay and m_current["approx_kl"] == 0.0
    assert m_current["uncond_reused"] == 6.0


def test_current_source_is_refused_with_several_updates_and_unknown_sources() -> None:
    """The loss forward is π_old only before the first optimizer step of a rollout."""
    from unirl.train.stack import TrainStack

    algo = FlowGRPO(pipeline=make_pipeline(), old_logp_source="current")
    with pytest.raises(ConfigError, match="num_updates_per_batch=1"):
        TrainStack(backend=object(), algorithm=algo, num_updates_per_batch=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'replay', 'rollout', 'current'"):
        FlowGRPO(pipeline=make_pipeline(), old_logp_source="old")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'replay', 'rollout', got 'current'"):
        FlowDPPO(pipeline=make_pipeline(), old_logp_source="current")  # type: ignore[arg-type]
