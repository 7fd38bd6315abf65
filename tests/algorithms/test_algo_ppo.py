"""PPO with a value head and GAE(γ, λ): GAE on a hand-computed trajectory; the loss (clipped
policy term on whitened GAE advantages + clipped value loss) and its gradient equal a float64
per-token loop (1e-6) across micro-batches; validation."""

from __future__ import annotations

import pytest
import torch
from test_algo_text import ADV, VOCAB, TinyLM, _batch, _move

from unirl.algorithms import PPO
from unirl.algorithms.ppo import gae
from unirl.config import ConfigError
from unirl.types import Packed, TextEmbedConditions, TextSegment

GAMMA, LAM, VF, VCLIP = 0.9, 0.8, 0.5, 0.05


class TinyLMV(TinyLM):
    """TinyLM plus a value head on the same hidden state (the one that predicts token t)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.value = torch.nn.Linear(self.head.in_features, 1)

    def _hidden(self, conditions: TextEmbedConditions, segment: TextSegment) -> torch.Tensor:
        tokens, offsets = segment.tokens.values, segment.tokens.offsets
        prev = torch.roll(tokens, 1)
        prev[offsets[:-1][offsets[:-1] < len(tokens)]] = VOCAB
        rows = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets[1:] - offsets[:-1])
        return torch.tanh(self.emb(prev) + conditions.embeds[rows, 0])

    def token_values(self, conditions: TextEmbedConditions, segment: TextSegment) -> Packed:
        values = self.value(self._hidden(conditions, segment))[:, 0]
        return Packed(values=values, offsets=segment.tokens.offsets)


def test_gae_on_a_hand_computed_trajectory() -> None:
    """Row 0: a prompt token, then rewards (0, 0, 1), values (0.5, 0.6, 0.7); row 1: a prompt
    token then one step, reward 2, value 1.5. γ = 0.9, λ = 0.8:
    δ = (0.9·0.6 − 0.5, 0.9·0.7 − 0.6, 1 − 0.7) = (0.04, 0.03, 0.3);
    Â = (0.04 + 0.72·0.246, 0.03 + 0.72·0.3, 0.3) = (0.21712, 0.246, 0.3); row 1: Â = 0.5."""
    rewards = torch.tensor([9.0, 0.0, 0.0, 1.0, 9.0, 2.0], dtype=torch.float64)
    values = torch.tensor([9.0, 0.5, 0.6, 0.7, 9.0, 1.5], dtype=torch.float64)
    mask = torch.tensor([False, True, True, True, False, True])
    adv, ret = gae(rewards, values, torch.tensor([0, 4, 6]), mask, 0.9, 0.8)
    want = [0.0, 0.21712, 0.246, 0.3, 0.0, 0.5]
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        ret,
        torch.tensor([0.0, 0.71712, 0.846, 1.0, 0.0, 2.0], dtype=torch.float64),
        atol=1e-12,
        rtol=0,
    )
    # λ = 1, γ = 1: Â_t = Σ_{s≥t} r_s − V_t (Monte Carlo return minus the baseline)
    adv1, _ = gae(rewards, values, torch.tensor([0, 4, 6]), mask, 1.0, 1.0)
    torch.testing.assert_close(
        adv1[mask], torch.tensor([0.5, 0.4, 0.3, 0.5], dtype=torch.float64), atol=1e-12, rtol=0
    )


def _reference(policy, old_state, prepared, whiten: bool):
    """Float64 loop: reward A_i at each row's last loss token, GAE by its recursion, optional
    whitening over every loss token, then the token-mean policy and value losses."""
    net = TinyLMV().double()
    net.load_state_dict({k: v.double() for k, v in old_state.items()})
    rows = []  # (micro index, token index, row, old logp, V_old, r_t)
    with torch.no_grad():
        for m, (cond, seg, adv) in enumerate(prepared):
            c64 = TextEmbedConditions(embeds=cond.embeds.double())
            old_lp = net.token_log_probs(c64, seg).values
            old_v = net.token_values(c64, seg).values
            for i in range(len(seg.tokens)):
                lo, hi = int(seg.tokens.offsets[i]), int(seg.tokens.offsets[i + 1])
                steps = [t for t in range(lo, hi) if bool(seg.loss_mask.values[t])]
                for k, t in enumerate(steps):
                    r = float(adv[i]) if k == len(steps) - 1 else 0.0
                    rows.append([m, t, i, float(old_lp[t]), float(old_v[t]), r, len(steps) - k])
    # GAE per row, walking back from each row's last step
    advs = {}
    for key in {(r[0], r[2]) for r in rows}:
        steps = [r for r in rows if (r[0], r[2]) == key]
        running, next_v = 0.0, 0.0
        for r in reversed(steps):
            running = r[5] + GAMMA * next_v - r[4] + GAMMA * LAM * running
            advs[(r[0], r[1])] = running
            next_v = r[4]
    a = torch.tensor([advs[(r[0], r[1])] for r in rows], dtype=torch.float64)
    targets = a + torch.tensor([r[4] for r in rows], dtype=torch.float64)
    if whiten:
        a = (a - a.mean()) / (a.std(unbiased=False) + 1e-8)
    net.load_state_dict({k: v.double() for k, v in policy.state_dict().items()})
    total = torch.zeros((), dtype=torch.float64)
    for m, (cond, seg, _) in enumerate(prepared):
        c64 = TextEmbedConditions(embeds=cond.embeds.double())
        cur = net.token_log_probs(c64, seg).values
        val = net.token_values(c64, seg).values
        for j, r in enumerate(rows):
            if r[0] != m:
                continue
            t = r[1]
            ratio = torch.exp(cur[t] - r[3])
            pol = torch.maximum(-a[j] * ratio, -a[j] * torch.clamp(ratio, 0.8, 1.2))
            v_clip = r[4] + torch.clamp(val[t] - r[4], -VCLIP, VCLIP)
            vf = 0.5 * torch.maximum((val[t] - targets[j]) ** 2, (v_clip - targets[j]) ** 2)
            total = total + pol + VF * vf
    total = total / len(rows)
    total.backward()
    return float(total.detach()), [p.grad for p in net.parameters()], a


@pytest.mark.parametrize(("micro", "whiten"), [(1, True), (2, True), (4, False)])
def test_ppo_equals_its_formula_in_float64(micro: int, whiten: bool) -> None:
    """Policy and value losses, gradient (value head included) and Â equal the float64 loop
    (1e-6); a wrong λ, a missing value clip or a per-micro-batch whitening fails here."""
    conditions, segment = _batch(seed=6)
    policy = TinyLMV()
    with torch.no_grad():
        policy.value.weight.mul_(3.0)  # values of order 1, so the value clip acts
    algo = PPO(policy=policy, gamma=GAMMA, lam=LAM, vf_coef=VF, value_clip=VCLIP, whiten=whiten)
    old_state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    prepared = []
    for start in range(0, len(ADV), micro):
        idx = torch.arange(start, min(start + micro, len(ADV)))
        cond = conditions.select(idx)
        prepared.append((cond, algo.prepare_segment(cond, segment.select(idx)), ADV[idx]))
    prepared = algo.prepare_batch(prepared)
    _move(policy, 0.1)
    weights = [algo.micro_batch_weight(s, a) for _, s, a in prepared]
    loss = sum(
        float(algo.compute_loss_and_backward(c, s, a, loss_scale=w / sum(weights)).loss)
        for (c, s, a), w in zip(prepared, weights, strict=True)
    )
    grads = [p.grad.clone() for p in policy.parameters()]
    want, want_grads, a_hat = _reference(policy, old_state, prepared, whiten)
    assert loss == pytest.approx(want, abs=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g.double(), w, atol=1e-6, rtol=0)
    assert float(grads[-1].abs().sum()) > 0  # the value head's bias learns
    got = torch.cat([s.token_advantages.values[s.loss_mask.values.bool()] for _, s, _ in prepared])
    torch.testing.assert_close(got.double(), a_hat, atol=1e-6, rtol=0)


def test_ppo_validation() -> None:
    with pytest.raises(ConfigError, match=r"has no value head: build the pipeline"):
        PPO(policy=TinyLM())
    with pytest.raises(ConfigError, match=r"algorithm\.lam must be in \[0, 1\]"):
        PPO(policy=TinyLMV(), lam=1.5)
    with pytest.raises(ConfigError, match=r"algorithm\.value_clip must be > 0 or null"):
        PPO(policy=TinyLMV(), value_clip=0.0)
    with pytest.raises(ConfigError, match=r"old_logp_source=current has no π_old or V_old"):
        PPO(policy=TinyLMV(), old_logp_source="current")  # type: ignore[arg-type]
