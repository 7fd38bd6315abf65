"""Token-level losses beyond the per-token formulas (test_algo_text.py): the micro-batch
weights that make a mini-batch's loss independent of how it is cut, the rollout-vs-replay
gap metric, and truncated importance sampling against a float64 loop."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.algorithms import DRPO, GRPO
from unirl.config import ConfigError
from unirl.types import Packed, TextEmbedConditions, TextSegment

VOCAB, HIDDEN = 9, 6
LENGTHS = [4, 7, 3, 6, 5, 2]
PROMPT = [2, 3, 1, 2, 4, 1]
ADV = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.25, 0.8])
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class RowLM(torch.nn.Module):
    """log π(y_t | y_{t-1}, row condition): rows independent, as packed rows must be."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.emb = torch.nn.Embedding(VOCAB + 1, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def token_log_probs(self, conditions: TextEmbedConditions, segment: TextSegment) -> Packed:
        tokens, offsets = segment.tokens.values, segment.tokens.offsets
        prev = torch.roll(tokens, 1)
        prev[offsets[:-1]] = VOCAB
        rows = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets[1:] - offsets[:-1])
        hidden = torch.tanh(self.emb(prev) + conditions.embeds[rows, 0])
        logp = torch.log_softmax(self.head(hidden), dim=-1)
        return Packed(values=logp.gather(1, tokens[:, None])[:, 0], offsets=offsets)


def batch(shift: float = 0.0) -> tuple[TextEmbedConditions, TextSegment, RowLM]:
    """A segment whose recorded log-probs are the policy's minus ``shift`` on loss tokens."""
    gen = torch.Generator().manual_seed(0)
    tokens = Packed.from_list([torch.randint(0, VOCAB, (n,), generator=gen) for n in LENGTHS])
    mask = Packed.from_list([torch.arange(n) >= p for n, p in zip(LENGTHS, PROMPT)])
    cond = TextEmbedConditions(embeds=torch.randn(len(LENGTHS), 1, HIDDEN, generator=gen))
    policy = RowLM()
    seg = TextSegment(tokens=tokens, loss_mask=mask)
    with torch.no_grad():
        recorded = policy.token_log_probs(cond, seg).values - shift * mask.values.float()
    seg = TextSegment(
        tokens=tokens, loss_mask=mask, log_probs=Packed(values=recorded, offsets=tokens.offsets)
    )
    return cond, seg, policy


def stack_step(algo, cond, seg, cuts: list[list[int]]) -> tuple[float, list[torch.Tensor]]:
    """What TrainStack does for one mini-batch cut into ``cuts``: anchor, weigh, backward."""
    micro = [
        (cond.select(c), algo.prepare_segment(cond.select(c), seg.select(c)), ADV[c]) for c in cuts
    ]
    weights = [algo.micro_batch_weight(s, a) for _, s, a in micro]
    loss = sum(
        float(algo.compute_loss_and_backward(c, s, a, loss_scale=w / sum(weights)).loss)
        for (c, s, a), w in zip(micro, weights, strict=True)
    )
    grads = [p.grad.clone() for p in algo.policy.parameters()]
    return loss, grads


def perturb(policy: RowLM) -> None:
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.4 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["grpo", "drpo"])
def test_mini_batch_loss_does_not_depend_on_the_micro_batch_cut(kind: str, mode: str) -> None:
    results = []
    for cuts in ([[0, 1, 2, 3, 4, 5]], [[0, 5], [1, 2, 3], [4]], [[i] for i in range(6)]):
        cond, seg, policy = batch()
        make = GRPO if kind == "grpo" else DRPO
        algo = make(policy=policy, loss_agg=mode, norm_length=8)
        # anchor first (ratio 1 at the cut's geometry), then move off-policy so clip and
        # penalty terms are exercised, then one weighted backward
        micro = [algo.prepare_segment(cond.select(c), seg.select(c)) for c in cuts]
        perturb(policy)
        weights = [algo.micro_batch_weight(s, ADV[c]) for s, c in zip(micro, cuts, strict=True)]
        loss = 0.0
        for s, c, w in zip(micro, cuts, weights, strict=True):
            out = algo.compute_loss_and_backward(cond.select(c), s, ADV[c], w / sum(weights))
            loss += float(out.loss)
        results.append((loss, [p.grad.clone() for p in policy.parameters()]))
    for loss, grads in results[1:]:
        assert abs(loss - results[0][0]) < 1e-6
        for a, b in zip(grads, results[0][1], strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_weights_count_what_each_mode_averages_over() -> None:
    _, seg, policy = batch()
    loss_tokens = sum(n - p for n, p in zip(LENGTHS, PROMPT))
    assert GRPO(policy=policy).micro_batch_weight(seg, ADV) == float(loss_tokens)
    assert GRPO(policy=policy, loss_agg="seq-mean-token-mean").micro_batch_weight(seg, ADV) == 6.0
    algo = GRPO(policy=policy, loss_agg="seq-mean-token-sum-norm", norm_length=8)
    assert algo.micro_batch_weight(seg, ADV) == 6.0


@pytest.mark.parametrize("source", ["replay", "rollout"])
def test_logp_gap_is_the_mean_abs_difference_per_loss_token(source: str) -> None:
    cond, seg, policy = batch(shift=0.125)
    algo = GRPO(policy=policy, old_logp_source=source)
    algo.start_rollout(7)
    stack_step(algo, cond, seg, [[0, 1, 2], [3, 4, 5]])
    out = algo.after_train(7)
    assert out["rollout/logp_gap"] == pytest.approx(0.125, abs=1e-6)
    assert out["rollout/logp_gap_max"] == pytest.approx(0.125, abs=1e-6)
    algo.start_rollout(8)  # a new rollout starts from zero
    assert "rollout/logp_gap" not in algo.after_train(8)


def test_truncated_importance_sampling_matches_a_float64_loop() -> None:
    cond, seg, policy = batch()
    gen = torch.Generator().manual_seed(9)
    noise = torch.randn(seg.tokens.values.shape, generator=gen) * 0.5
    recorded = seg.log_probs.values + noise * seg.loss_mask.values.float()
    seg = TextSegment(
        tokens=seg.tokens,
        loss_mask=seg.loss_mask,
        log_probs=Packed(values=recorded, offsets=seg.tokens.offsets),
    )
    cap = 1.5
    algo = GRPO(policy=policy, clip_low=0.2, clip_high=0.28, tis_cap=cap)
    prepared = algo.prepare_segment(cond, seg)
    assert torch.equal(prepared.rollout_log_probs.values, recorded)
    perturb(policy)
    result = algo.compute_loss_and_backward(cond, prepared, ADV, 1.0)
    ours = [p.grad.clone() for p in policy.parameters()]
    for p in policy.parameters():
        p.grad = None
    # the loop: token-mean of min(π_old / π_rollout, C) · max(-A r, -A clip(r))
    current = policy.token_log_probs(cond, seg).values
    total, count, capped = torch.zeros((), dtype=torch.float64), 0, 0
    for i in range(len(LENGTHS)):
        lo, hi = int(seg.tokens.offsets[i]), int(seg.tokens.offsets[i + 1])
        for t in range(lo, hi):
            if not bool(seg.loss_mask.values[t]):
                continue
            old, roll = float(prepared.log_probs.values[t]), float(recorded[t])
            w = min(math.exp(old - roll), cap)
            capped += w == cap
            r = torch.exp(current[t].double() - old)
            a = float(ADV[i])
            total = total + w * torch.maximum(-a * r, -a * torch.clamp(r, 0.8, 1.28))
            count += 1
    expected = total / count
    assert abs(float(result.loss) - float(expected.detach())) < 1e-6
    expected.backward()
    for a, p in zip(ours, policy.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-6, rtol=1e-5)
    metrics = algo.summarize(result.terms)
    assert 0 < capped < count and metrics["tis/capped_frac"] == pytest.approx(capped / count)


def test_tis_needs_the_replayed_anchor_and_recorded_log_probs() -> None:
    cond, seg, policy = batch()
    with pytest.raises(ConfigError, match="old_logp_source=replay"):
        GRPO(policy=policy, tis_cap=2.0, old_logp_source="rollout")
    with pytest.raises(ConfigError, match="tis_cap must be > 0"):
        DRPO(policy=policy, tis_cap=0.0)
    bare = TextSegment(tokens=seg.tokens, loss_mask=seg.loss_mask)
    with pytest.raises(ValueError, match="recorded none"):
        GRPO(policy=policy, tis_cap=2.0).prepare_segment(cond, bare)
