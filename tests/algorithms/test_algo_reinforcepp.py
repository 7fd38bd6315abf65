"""REINFORCE++ on hand-built packed token batches (the tiny policy of test_algo_text): the
KL-shaped, batch-normalised token advantages and the clipped loss equal a float64 per-token
loop of docs/math.md's formula (1e-6), across micro-batches; validation."""

from __future__ import annotations

import pytest
import torch
from test_algo_text import ADV, LENGTHS, TinyLM, _batch, _move, _shifted

from unirl.algorithms import ReinforcePP
from unirl.algorithms.reinforcepp import batch_token_stats, kl_to_go
from unirl.config import ConfigError
from unirl.types import TextEmbedConditions

BETA, EPS_LOW, EPS_HIGH = 0.3, 0.2, 0.28


def _prepare(algo: ReinforcePP, conditions, segment, micro: int, adv: torch.Tensor) -> list:
    """TrainStack's order: prepare_segment on every micro-batch, then prepare_batch once."""
    out = []
    for start in range(0, len(adv), micro):
        idx = torch.arange(start, min(start + micro, len(adv)))
        cond = conditions.select(idx)
        out.append((cond, algo.prepare_segment(cond, segment.select(idx)), adv[idx]))
    return algo.prepare_batch(out)


def _step(algo: ReinforcePP, prepared: list) -> float:
    """One optimizer step's backward, each micro-batch weighted as TrainStack weighs it."""
    weights = [algo.micro_batch_weight(s, a) for _, s, a in prepared]
    return sum(
        float(algo.compute_loss_and_backward(c, s, a, loss_scale=w / sum(weights)).loss)
        for (c, s, a), w in zip(prepared, weights, strict=True)
    )


def _reference_64(policy: TinyLM, conditions, segment, adv, beta, old_state, ref_bias_shift):
    """Float64 loop: k1 per loss token, G_t = A_i − β Σ_{s≥t} k1_s, global token mean / std,
    clipped token loss summed over the batch / loss tokens. Returns (loss, grads, Â)."""
    net = TinyLM().double()

    def logp(state, cond):
        net.load_state_dict({k: v.double() for k, v in state.items()})
        return net.token_log_probs(TextEmbedConditions(embeds=cond.embeds.double()), segment).values

    with torch.no_grad():
        old = logp(old_state, conditions)
        ref_state = dict(old_state)
        ref_state["head.bias"] = old_state["head.bias"] + ref_bias_shift
        ref = logp(ref_state, conditions)
    offsets, mask = segment.tokens.offsets, segment.loss_mask.values.bool()
    returns, where = [], []
    for i in range(len(LENGTHS)):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        for t in range(lo, hi):
            if not mask[t]:
                continue
            to_go = sum(float(old[s] - ref[s]) for s in range(t, hi) if mask[s])
            returns.append(float(adv[i]) - beta * to_go)
            where.append((i, t))
    g = torch.tensor(returns, dtype=torch.float64)
    a_hat = (g - g.mean()) / (g.std(unbiased=False) + 1e-8)
    net.load_state_dict({k: v.double() for k, v in policy.state_dict().items()})
    cur = net.token_log_probs(TextEmbedConditions(embeds=conditions.embeds.double()), segment)
    total = torch.zeros((), dtype=torch.float64)
    for (_, t), a in zip(where, a_hat.tolist(), strict=True):
        r = torch.exp(cur.values[t] - old[t])
        total = total + torch.maximum(-a * r, -a * torch.clamp(r, 1 - EPS_LOW, 1 + EPS_HIGH))
    total = total / len(where)
    total.backward()
    return float(total.detach()), [p.grad for p in net.parameters()], a_hat


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_reinforcepp_equals_its_formula_in_float64(micro: int) -> None:
    """Loss, gradient and token advantages equal the float64 loop (1e-6) whatever the
    micro-batching: the mean / std are over every loss token of the batch (a per-micro-batch
    or per-group normalisation, a KL with the wrong sign or summed forward instead of to-go,
    each fails here)."""
    conditions, segment = _batch(seed=5)
    policy = TinyLM()
    shift = torch.linspace(-0.5, 0.5, 11)
    algo = ReinforcePP(policy=policy, clip_low=EPS_LOW, clip_high=EPS_HIGH, kl={"beta": BETA})
    algo.bind_reference(lambda: _shifted(policy))
    old_state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    prepared = _prepare(algo, conditions, segment, micro, ADV)
    _move(policy, 0.05)
    loss = _step(algo, prepared)
    grads = [p.grad.clone() for p in policy.parameters()]
    want, want_grads, a_hat = _reference_64(
        policy, conditions, segment, ADV, BETA, old_state, shift.double()
    )
    assert loss == pytest.approx(want, abs=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g.double(), w, atol=1e-6, rtol=0)
    got = torch.cat([s.token_advantages.values for _, s, _ in prepared]).double()
    mask = torch.cat([s.loss_mask.values for _, s, _ in prepared]).bool()
    torch.testing.assert_close(got[mask], a_hat, atol=1e-6, rtol=0)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))
    # the KL did shape the advantages: not a broadcast of the per-sample ones
    plain = torch.repeat_interleave(ADV.double(), torch.tensor(LENGTHS))[mask]
    plain = (plain - plain.mean()) / plain.std(unbiased=False)
    assert float((got[mask] - plain).abs().max()) > 1e-2


def test_reinforcepp_without_kl_is_the_token_normalised_advantage_and_shift_free() -> None:
    """β = 0: Â is the per-sample advantage normalised over loss tokens (every token of a
    sample the same), no reference is run, and adding a constant to every advantage (a
    different baseline, scope global vs none) changes nothing."""
    conditions, segment = _batch(seed=2)
    algo = ReinforcePP(policy=TinyLM())  # no reference bound: β = 0 must not ask for one
    a = _prepare(algo, conditions, segment, 2, ADV)
    b = _prepare(algo, conditions, segment, 2, ADV + 3.0)
    got = torch.cat([s.token_advantages.values for _, s, _ in a]).double()
    got_b = torch.cat([s.token_advantages.values for _, s, _ in b]).double()
    mask = segment.loss_mask.values.bool()
    counts = torch.tensor([int(m.sum()) for m in segment.loss_mask.to_list()])
    per_token = torch.repeat_interleave(ADV.double(), counts)
    want = (per_token - per_token.mean()) / per_token.std(unbiased=False)
    torch.testing.assert_close(got[mask], want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got, got_b, atol=1e-6, rtol=0)


def test_kl_to_go_by_hand() -> None:
    """Σ_{s≥t} k1_s within each row, loss tokens only: rows [1, 2, 3 | 4, 5] with the first
    token of each row masked out."""
    k1 = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    mask = torch.tensor([False, True, True, False, True])
    got = kl_to_go(k1, torch.tensor([0, 3, 5]), mask)
    assert got.tolist() == [0.0, 5.0, 3.0, 0.0, 5.0]


def test_reinforcepp_validation() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.old_logp_source=current has no π_old"):
        ReinforcePP(policy=TinyLM(), old_logp_source="current")
    with pytest.raises(ConfigError, match=r"algorithm\.adv_eps must be >= 0"):
        ReinforcePP(policy=TinyLM(), adv_eps=-1.0)
    with pytest.raises(TypeError, match="clip_hihg"):
        ReinforcePP(policy=TinyLM(), clip_hihg=0.3)  # type: ignore[call-arg]


def _stats_by_hand(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    picked = torch.cat([v.double()[m].cpu() for v, m in parts])
    return float(picked.mean()), float(picked.std(unbiased=False))


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ),
    ],
)
def test_batch_token_stats_on_the_values_device(device: str) -> None:
    """Mean and population std over every part's masked values, on the parts' own device
    (a host-side count tensor beside device sums failed PPO's first GPU step: torch.stack of
    cpu and cuda tensors)."""
    gen = torch.Generator().manual_seed(3)
    parts = []
    for n in (5, 7):
        values = torch.randn(n, generator=gen).to(device)
        mask = (torch.rand(n, generator=gen) > 0.3).to(device)
        parts.append((values, mask))
    mean, std = batch_token_stats(parts)
    want_mean, want_std = _stats_by_hand(parts)
    assert mean == pytest.approx(want_mean, abs=1e-12)
    assert std == pytest.approx(want_std, abs=1e-12)
