"""GRPO and DRPO on hand-built packed token batches with a tiny torch policy that implements
the ``token_log_probs`` protocol: on-policy exactness, loss and gradient vs an independent
per-token loop implementation, KL to a reference, validation."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from flow_fakes import anchor, run_update, update

from unirl.algorithms import DRPO, GRPO, KLConfig, TokenPolicy
from unirl.config import ConfigError
from unirl.types import Packed, TextEmbedConditions, TextSegment

VOCAB, HIDDEN = 11, 8
LENGTHS = [3, 5, 2, 6]
PROMPT = [1, 2, 1, 3]  # leading tokens without loss
ADV = torch.tensor([1.0, -0.5, 2.0, -1.5])
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
NORM = 8


class TinyLM(torch.nn.Module):
    """log π(y_t | y_{t−1}, c): embedding of the previous token (BOS at row starts) plus the
    row's condition, a tanh, a linear head. Rows are independent, as packed rows must be."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB + 1, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def token_log_probs(self, conditions: TextEmbedConditions, segment: TextSegment) -> Packed:
        tokens, offsets = segment.tokens.values, segment.tokens.offsets
        prev = torch.roll(tokens, 1)
        prev[offsets[:-1][offsets[:-1] < len(tokens)]] = VOCAB  # BOS
        rows = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets[1:] - offsets[:-1])
        hidden = torch.tanh(self.emb(prev) + conditions.embeds[rows, 0])
        logp = torch.log_softmax(self.head(hidden), dim=-1)
        return Packed(values=logp.gather(1, tokens[:, None]).squeeze(1), offsets=offsets)


def _batch(seed: int = 0) -> tuple[TextEmbedConditions, TextSegment]:
    gen = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, VOCAB, (n,), generator=gen) for n in LENGTHS]
    masks = [torch.arange(n) >= p for n, p in zip(LENGTHS, PROMPT)]
    conditions = TextEmbedConditions(embeds=torch.randn(len(LENGTHS), 1, HIDDEN, generator=gen))
    return conditions, TextSegment(
        tokens=Packed.from_list(tokens), loss_mask=Packed.from_list(masks)
    )


def _make(kind: str, policy: TinyLM, mode: str, **kw) -> GRPO | DRPO:
    if kind == "grpo":
        return GRPO(
            policy=policy, clip_low=0.2, clip_high=0.28, loss_agg=mode, norm_length=NORM, **kw
        )
    return DRPO(
        policy=policy,
        epsilon=0.2,
        token_adaptive=kind == "drpo_adaptive",
        loss_agg=mode,
        norm_length=NORM,
        **kw,
    )


def _move(policy: torch.nn.Module, scale: float) -> None:
    """Move off-policy by a fixed random step (same for every loss and mode)."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
            p.grad = None


@contextlib.contextmanager
def _shifted(policy: torch.nn.Module):
    """Reference stand-in: temporarily different head bias."""
    saved = policy.head.bias.detach().clone()
    with torch.no_grad():
        policy.head.bias.add_(torch.linspace(-0.5, 0.5, VOCAB))
    try:
        yield
    finally:
        with torch.no_grad():
            policy.head.bias.copy_(saved)


def _independent_loss(
    kind: str, mode: str, policy: TinyLM, prepared, kl_beta: float, reference
) -> torch.Tensor:
    """Per-token loops over the formulas of docs/math.md; differentiable (sums of scalars)."""
    n = sum(len(a) for _, _, a in prepared)
    total = torch.zeros(())
    for cond, seg, adv in prepared:
        cur = policy.token_log_probs(cond, seg).values
        if kl_beta > 0:
            with torch.no_grad(), reference():
                ref = policy.token_log_probs(cond, seg).values
        rows = []
        for i in range(len(seg.tokens)):
            lo, hi = int(seg.tokens.offsets[i]), int(seg.tokens.offsets[i + 1])
            row = []
            for t in range(lo, hi):
                if not bool(seg.loss_mask.values[t]):
                    continue
                a = float(adv[i])
                old = float(seg.log_probs.values[t])
                r = torch.exp(cur[t] - old)
                if kind == "grpo":
                    rc = torch.clamp(r, 1 - 0.2, 1 + 0.28)
                    term = torch.maximum(-a * r, -a * rc)
                else:
                    w = math.exp(old) if kind == "drpo_adaptive" else 1.0
                    term = -a * r + abs(a) * w * (r - 1) ** 2 / (2 * 0.2)
                if kl_beta > 0:
                    d = ref[t] - cur[t]
                    term = term + kl_beta * (torch.exp(d) - d - 1)
                row.append(term)
            rows.append(row)
        if mode == "token-mean":
            flat = [x for r in rows for x in r]
            loss = sum(flat) / len(flat)
        elif mode == "seq-mean-token-mean":
            means = [sum(r) / len(r) for r in rows if r]
            loss = sum(means) / len(means)
        else:
            loss = sum(sum(r) / NORM for r in rows if r) / len(rows)
        total = total + loss * (len(adv) / n)
    return total


KINDS = ["grpo", "drpo", "drpo_adaptive"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_first_ratio_is_exactly_one(kind: str, mode: str) -> None:
    policy = TinyLM()
    conditions, segment = _batch()
    algo = _make(kind, policy, mode)
    terms = run_update(algo, conditions, segment, 2, ADV)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    assert terms["ratio"].numel() == sum(n - p for n, p in zip(LENGTHS, PROMPT))
    assert algo.summarize(terms)["approx_kl"] == 0.0
    assert any(float(p.grad.abs().max()) > 0 for p in policy.parameters())


@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_loss_and_grad_match_independent_loops(kind: str, mode: str, kl_beta: float) -> None:
    policy = TinyLM()
    conditions, segment = _batch()
    algo = _make(kind, policy, mode, kl=KLConfig(beta=kl_beta))
    algo.bind_reference(lambda: _shifted(policy))
    prepared = anchor(algo, conditions, segment, 2, ADV)
    update(algo, prepared)
    _move(policy, 0.3)  # off-policy: ratios leave [0.8, 1.28] for some tokens
    loss, terms = update(algo, prepared)
    ours = [p.grad.clone() for p in policy.parameters()]
    ratio = terms["ratio"]
    assert float(ratio.max()) > 1.28 or float(ratio.min()) < 0.8, "the clip must be exercised"
    for p in policy.parameters():
        p.grad = None
    expected = _independent_loss(kind, mode, policy, prepared, kl_beta, lambda: _shifted(policy))
    assert abs(loss - float(expected.detach())) < 1e-6 * max(1.0, abs(float(expected.detach())))
    expected.backward()
    for a, b in zip(ours, [p.grad for p in policy.parameters()], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    if kl_beta > 0:
        assert float(terms["kl"].max()) > 0 and "kl_loss" in algo.summarize(terms)


@pytest.mark.parametrize("kind", KINDS)
def test_token_losses_feed_their_kl_to_an_adaptive_beta(kind: str) -> None:
    policy = TinyLM()
    conditions, segment = _batch()
    kl = KLConfig(beta=0.1, control="adaptive", target=1e-6, horizon=2)
    algo = _make(kind, policy, "token-mean", kl=kl)
    algo.bind_reference(lambda: _shifted(policy))
    terms = run_update(algo, conditions, segment, 2, ADV)
    assert algo.summarize(terms)["kl/beta"] == 0.1
    out = algo.after_train(0)  # the mean k3 of every loss token of the rollout
    assert out["kl/rollout_mean"] == pytest.approx(float(terms["kl"].double().mean()), rel=1e-6)
    assert out["kl/beta_next"] == pytest.approx(0.1 * 1.1, rel=1e-12)  # KL ≫ target: e = +0.2
    assert algo.state_dict()["kl_controller"]["beta"] == out["kl/beta_next"]


def test_grpo_clipfrac_metrics_use_asymmetric_bounds() -> None:
    algo = GRPO(policy=TinyLM(), clip_low=0.2, clip_high=0.28)
    ratio = torch.tensor([1.25, 1.3, 0.79, 1.0])
    terms = {
        "ratio": ratio,
        "log_ratio": ratio.log(),
        "policy_loss": torch.zeros(4),
        "num_tokens": torch.tensor([4.0]),
    }
    m = algo.summarize(terms)
    assert m["clipfrac/above"] == 0.25 and m["clipfrac/below"] == 0.25 and m["tokens"] == 4.0


def test_rollout_source_uses_recorded_log_probs() -> None:
    policy = TinyLM()
    conditions, segment = _batch()
    with pytest.raises(ValueError, match="recorded no log_probs"):
        GRPO(policy=policy, old_logp_source="rollout").prepare_segment(conditions, segment)
    recorded = policy.token_log_probs(conditions, segment).values.detach() - 0.1
    seg = TextSegment(
        tokens=segment.tokens,
        loss_mask=segment.loss_mask,
        log_probs=Packed(values=recorded, offsets=segment.tokens.offsets),
    )
    terms = run_update(GRPO(policy=policy, old_logp_source="rollout"), conditions, seg, 4, ADV)
    torch.testing.assert_close(
        terms["ratio"], torch.full_like(terms["ratio"], math.exp(0.1)), atol=1e-6, rtol=0
    )


def test_validation_and_protocol() -> None:
    policy = TinyLM()
    assert isinstance(policy, TokenPolicy)
    with pytest.raises(ConfigError, match="norm_length"):
        GRPO(policy=policy, loss_agg="seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match="loss_agg"):
        DRPO(policy=policy, loss_agg="sum")
    with pytest.raises(ConfigError, match="token_log_probs"):
        GRPO(policy=object())
    with pytest.raises(ConfigError, match="epsilon"):
        DRPO(policy=policy, epsilon=0.0)
    conditions, segment = _batch()

    class Shifted(TinyLM):
        def token_log_probs(self, conditions, segment):
            out = super().token_log_probs(conditions, segment)
            return Packed(
                values=out.values[:-1], offsets=torch.cat([out.offsets[:-1], out.offsets[-1:] - 1])
            )

    with pytest.raises(ValueError, match="offsets"):
        GRPO(policy=Shifted()).prepare_segment(conditions, segment)


@pytest.mark.parametrize("kind", KINDS)
def test_garbage_log_probs_at_masked_positions_do_not_poison_gradients(kind: str) -> None:
    """Engines may report anything at prompt positions; exp(+200) = inf must not become NaN."""
    policy = TinyLM()
    conditions, segment = _batch()
    recorded = policy.token_log_probs(conditions, segment).values.detach().clone()
    recorded[~segment.loss_mask.values] = -200.0
    seg = TextSegment(
        tokens=segment.tokens,
        loss_mask=segment.loss_mask,
        log_probs=Packed(values=recorded, offsets=segment.tokens.offsets),
    )
    algo = _make(kind, policy, "token-mean", kl=KLConfig(beta=0.1), old_logp_source="rollout")
    algo.bind_reference(lambda: _shifted(policy))
    terms = run_update(algo, conditions, seg, 4, ADV)
    assert torch.equal(terms["ratio"], torch.ones_like(terms["ratio"]))
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_current_source_equals_replay_in_one_update_without_the_replay(kind, mode) -> None:
    """``old_logp_source=current``: π_old is the loss forward's own log-probs, so one update
    gives the replay anchor's loss, terms and gradients exactly, with no policy call in
    ``prepare_segment``; the recorded log-probs still give the rollout-vs-trainer gap."""
    conditions, segment = _batch()
    recorded = TinyLM().token_log_probs(conditions, segment).values.detach() + 0.25
    segment = TextSegment(
        tokens=segment.tokens,
        loss_mask=segment.loss_mask,
        log_probs=Packed(values=recorded, offsets=segment.tokens.offsets),
    )
    results = {}
    for source in ("replay", "current"):
        policy = TinyLM()
        algo = _make(kind, policy, mode, kl=KLConfig(beta=0.1), old_logp_source=source)
        algo.bind_reference(lambda policy=policy: _shifted(policy))
        calls: list[int] = []

        def counted(c, s, calls=calls, original=policy.token_log_probs):
            calls.append(1)
            return original(c, s)

        policy.token_log_probs = counted  # type: ignore[method-assign]
        algo.start_rollout(0)
        prepared = anchor(algo, conditions, segment, 2, ADV)
        anchor_calls = len(calls)
        loss, terms = update(algo, prepared)
        grads = [p.grad.clone() for p in policy.parameters()]
        results[source] = (loss, terms, grads, anchor_calls, algo.after_train(0))
    (l_r, t_r, g_r, calls_r, m_r), (l_c, t_c, g_c, calls_c, m_c) = (
        results["replay"],
        results["current"],
    )
    assert (calls_r, calls_c) == (2, 0)  # two micro-batches replayed; none with current
    assert l_c == l_r
    for key in t_r:
        assert torch.equal(t_c[key], t_r[key]), key
    assert torch.equal(t_c["ratio"], torch.ones_like(t_c["ratio"]))
    for a, b in zip(g_c, g_r, strict=True):
        assert torch.equal(a, b)
    assert m_c["rollout/logp_gap"] == pytest.approx(0.25, abs=1e-6)
    assert m_c["rollout/logp_gap"] == pytest.approx(m_r["rollout/logp_gap"], abs=1e-7)


def test_current_source_is_refused_with_several_updates_per_rollout() -> None:
    from unirl.train import TrainStack

    algo = GRPO(policy=TinyLM(), old_logp_source="current")
    with pytest.raises(
        ConfigError, match=r"old_logp_source=current .* set stack.num_updates_per_batch=1"
    ):
        TrainStack(backend=None, algorithm=algo, num_updates_per_batch=2)
    with pytest.raises(ConfigError, match="'replay', 'rollout' or 'current'"):
        GRPO(policy=TinyLM(), old_logp_source="sampler")


@pytest.mark.parametrize("clip", [(0.2, 0.28), (3e-4, 4e-4)])
def test_gspo_equals_its_sequence_formula_in_float64(clip) -> None:
    """GSPO: one length-normalised ratio per sequence, s_i = exp(mean_t(log π − log π_old))
    over the sequence's loss tokens, clipped; loss −mean_i min(s_i A_i, clip(s_i) A_i). The
    module's loss and gradient equal a float64 per-sequence loop (1e-6) with a wide and the
    paper's tight clip, and every loss token of a sequence carries s_i. Dropping the
    stop-gradient on s_i doubles the gradient and fails this test."""
    from unirl.algorithms import GSPO

    conditions, segment = _batch(seed=3)
    policy = TinyLM()
    algo = GSPO(policy=policy, clip_low=clip[0], clip_high=clip[1])
    prepared = anchor(algo, conditions, segment, 2, ADV)
    _move(policy, 0.05)
    loss, terms = update(algo, prepared)
    got = [p.grad.clone() for p in policy.parameters()]

    ref = TinyLM().double()
    ref.load_state_dict({k: v.double() for k, v in policy.state_dict().items()})
    total = torch.zeros((), dtype=torch.float64)
    ratios = []
    for cond, seg, adv in prepared:
        cond64 = TextEmbedConditions(embeds=cond.embeds.double())
        cur = ref.token_log_probs(cond64, seg).values
        for i in range(len(seg.tokens)):
            lo, hi = int(seg.tokens.offsets[i]), int(seg.tokens.offsets[i + 1])
            keep = seg.loss_mask.values[lo:hi].bool()
            old = seg.log_probs.values[lo:hi].double()[keep]
            s = torch.exp((cur[lo:hi][keep] - old).mean())
            a = float(adv[i])
            term = torch.maximum(-a * s, -a * torch.clamp(s, 1 - clip[0], 1 + clip[1]))
            total = total + term / len(LENGTHS)
            ratios.extend([float(s.detach())] * int(keep.sum()))
    total.backward()
    assert float(loss) == pytest.approx(float(total.detach()), abs=1e-6)
    torch.testing.assert_close(
        terms["ratio"].double(), torch.tensor(ratios, dtype=torch.float64), atol=1e-6, rtol=0
    )
    for g, p in zip(got, ref.parameters(), strict=True):
        torch.testing.assert_close(g.double(), p.grad, atol=1e-6, rtol=0)
