"""DAPO's loss on hand-built packed token batches (the tiny policy of test_algo_text): the
decoupled clip and the token-level mean over the whole batch equal a float64 per-token loop
(1e-6) however the batch is cut into micro-batches (TrainStack's token weighting)."""

from __future__ import annotations

import pytest
import torch
from test_algo_text import ADV, LENGTHS, TinyLM, _batch, _move

from unirl.algorithms import DAPO, GRPO
from unirl.types import TextEmbedConditions


def _prepare(algo, conditions, segment, micro: int) -> list:
    out = []
    for start in range(0, len(ADV), micro):
        idx = torch.arange(start, min(start + micro, len(ADV)))
        cond = conditions.select(idx)
        out.append((cond, algo.prepare_segment(cond, segment.select(idx)), ADV[idx]))
    return algo.prepare_batch(out)


def _step(algo, prepared: list) -> float:
    weights = [algo.micro_batch_weight(s, a) for _, s, a in prepared]
    return sum(
        float(algo.compute_loss_and_backward(c, s, a, loss_scale=w / sum(weights)).loss)
        for (c, s, a), w in zip(prepared, weights, strict=True)
    )


@pytest.mark.parametrize("micro", [1, 3, 4])
def test_dapo_is_the_token_level_decoupled_clip_in_float64(micro: int) -> None:
    """L = Σ_{i,t} max(−A_i r_t, −A_i clip(r_t, 1 − 0.2, 1 + 0.28)) / Σ_i |y_i|: every loss
    token weighs the same, so a long sample counts more than a short one (a per-sequence
    mean, or a symmetric clip, fails this: the step moves tokens past 1.2 and 1.28)."""
    conditions, segment = _batch(seed=4)
    policy = TinyLM()
    algo = DAPO(policy=policy)
    assert (algo.clip_low, algo.clip_high, algo.loss_agg) == (0.2, 0.28, "token-mean")
    prepared = _prepare(algo, conditions, segment, micro)
    _move(policy, 0.3)
    loss = _step(algo, prepared)
    grads = [p.grad.clone() for p in policy.parameters()]

    net = TinyLM().double()
    net.load_state_dict({k: v.double() for k, v in policy.state_dict().items()})
    total, tokens, ratios = torch.zeros((), dtype=torch.float64), 0, []
    for cond, seg, adv in prepared:
        cur = net.token_log_probs(TextEmbedConditions(embeds=cond.embeds.double()), seg).values
        for i in range(len(seg.tokens)):
            lo, hi = int(seg.tokens.offsets[i]), int(seg.tokens.offsets[i + 1])
            for t in range(lo, hi):
                if not bool(seg.loss_mask.values[t]):
                    continue
                a = float(adv[i])
                r = torch.exp(cur[t] - float(seg.log_probs.values[t]))
                ratios.append(float(r.detach()))
                total = total + torch.maximum(-a * r, -a * torch.clamp(r, 0.8, 1.28))
                tokens += 1
    total = total / tokens
    total.backward()
    assert tokens == sum(LENGTHS) - 7  # every completion token of the batch
    assert max(ratios) > 1.28 and min(ratios) < 0.8  # both clip sides are exercised
    assert loss == pytest.approx(float(total.detach()), abs=1e-6)
    for g, p in zip(grads, net.parameters(), strict=True):
        torch.testing.assert_close(g.double(), p.grad, atol=1e-6, rtol=0)


def test_dapo_differs_from_a_symmetric_clip_on_the_same_step() -> None:
    """The same batch and step under GRPO with ε_high = ε_low gives another loss: the
    decoupled ε_high is what the test above pins."""
    losses = []
    for algo_cls, kw in ((DAPO, {}), (GRPO, {"clip_low": 0.2, "clip_high": 0.2})):
        conditions, segment = _batch(seed=4)
        policy = TinyLM()
        algo = algo_cls(policy=policy, **kw)
        prepared = _prepare(algo, conditions, segment, 2)
        _move(policy, 0.3)
        losses.append(_step(algo, prepared))
    assert abs(losses[0] - losses[1]) > 1e-4
