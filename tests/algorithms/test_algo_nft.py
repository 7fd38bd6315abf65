"""DiffusionNFT: the loss vs an independent float64 implementation of docs/math.md (1e-6), the
clamp of the adaptive weights, the old-adapter EMA schedules, seeded noise, and adapter
switching / EMA / gradients with the real FSDPBackend on a tiny SD3 transformer."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_fakes import TARGETS, TINY_CONFIG, TinyBundle

from unirl.algorithms import DiffusionNFT, KLConfig, OldAdapterEMA, nft_loss
from unirl.algorithms.diffusionnft import draw_training_noise
from unirl.config import ConfigError
from unirl.sde import ODE, FlowSDE, flow_match_sigmas
from unirl.train import FSDPBackend, LoraConfig, OptimizerConfig, TrainStack
from unirl.types import LatentSegment, TextEmbedConditions

TOL = 1e-6
LATENT = (TINY_CONFIG["in_channels"], TINY_CONFIG["sample_size"], TINY_CONFIG["sample_size"])


# --------------------------------------------------------------------------- the pure loss


def reference_nft(v_theta, v_old, x_t, x0, t, adv, beta, c):
    """docs/math.md written out per sample in float64 with Python loops over samples."""
    total = 0.0
    pos_terms, neg_terms, w_pos, w_neg = [], [], [], []
    for i in range(x0.shape[0]):
        a = float(adv[i])
        r = 0.5 + 0.5 * min(max(a / c, -1.0), 1.0)
        ti = float(t[i])
        vp = beta * v_theta[i] + (1 - beta) * v_old[i].detach()
        vn = (1 + beta) * v_old[i].detach() - beta * v_theta[i]
        xp = x_t[i] - ti * vp
        xn = x_t[i] - ti * vn
        wp = max(float((xp - x0[i]).detach().abs().mean()), 1e-5)
        wn = max(float((xn - x0[i]).detach().abs().mean()), 1e-5)
        pos = ((xp - x0[i]) ** 2).mean() / wp
        neg = ((xn - x0[i]) ** 2).mean() / wn
        total = total + r * pos + (1 - r) * neg
        pos_terms.append(float(pos.detach()))
        neg_terms.append(float(neg.detach()))
        w_pos.append(wp)
        w_neg.append(wn)
    loss = total / x0.shape[0] * (c / beta)
    return loss, pos_terms, neg_terms, w_pos, w_neg


def _inputs(b: int = 5, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(b, 2, 3, 3, generator=g, dtype=dtype)
    eps = torch.randn(b, 2, 3, 3, generator=g, dtype=dtype)
    t = torch.rand(b, generator=g, dtype=dtype) * 0.9 + 0.05
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v_old = (eps - x0) + 0.3 * torch.randn(b, 2, 3, 3, generator=g, dtype=dtype)
    v_theta = v_old + 0.2 * torch.randn(b, 2, 3, 3, generator=g, dtype=dtype)
    adv = torch.tensor([2.0, -1.0, 0.0, 7.5, -9.0], dtype=dtype)[:b]  # two beyond ±c
    return v_theta, v_old, x_t, x0, t, adv


@pytest.mark.parametrize("beta", [1.0, 0.1, 1.7])
def test_nft_loss_matches_independent_float64_implementation(beta: float) -> None:
    v_theta, v_old, x_t, x0, t, adv = _inputs()
    v1 = v_theta.clone().requires_grad_(True)
    v2 = v_theta.clone().requires_grad_(True)
    out = nft_loss(v1, v_old, x_t, x0, t, adv, beta, 5.0)
    ref, pos, neg, wp, wn = reference_nft(v2, v_old, x_t, x0, t, adv, beta, 5.0)
    assert abs(out.loss.item() - ref.item()) < TOL
    torch.testing.assert_close(
        out.positive, torch.tensor(pos, dtype=torch.float64), atol=TOL, rtol=0
    )
    torch.testing.assert_close(
        out.negative, torch.tensor(neg, dtype=torch.float64), atol=TOL, rtol=0
    )
    torch.testing.assert_close(
        out.weight_pos, torch.tensor(wp, dtype=torch.float64), atol=TOL, rtol=0
    )
    torch.testing.assert_close(
        out.weight_neg, torch.tensor(wn, dtype=torch.float64), atol=TOL, rtol=0
    )
    assert out.r.tolist() == [0.7, 0.4, 0.5, 1.0, 0.0]
    out.loss.backward()
    ref.backward()
    torch.testing.assert_close(v1.grad, v2.grad, atol=TOL, rtol=0)


def test_nft_loss_in_fp32_is_close_to_float64() -> None:
    v_theta, v_old, x_t, x0, t, adv = _inputs()
    out = nft_loss(*(a.float() for a in (v_theta, v_old, x_t, x0, t, adv)), 1.0, 5.0)
    ref = nft_loss(v_theta, v_old, x_t, x0, t, adv, 1.0, 5.0)
    assert out.loss.dtype == torch.float32
    assert abs(float(out.loss) - float(ref.loss)) < 1e-5 * abs(float(ref.loss))


def test_adaptive_weights_are_clamped_at_1e_5_and_carry_no_gradient() -> None:
    v_theta, v_old, x_t, x0, t, adv = _inputs()
    # sample 0: both implicit policies predict x0 to within 1e-7 -> mean|x̂0 − x0| < 1e-5
    exact = (x_t[0] - x0[0]) / t[0]
    g = torch.Generator().manual_seed(3)
    v_old[0] = exact + 1e-7 * torch.randn(exact.shape, generator=g, dtype=exact.dtype)
    v_theta[0] = exact + 1e-7 * torch.randn(exact.shape, generator=g, dtype=exact.dtype)
    v1 = v_theta.clone().requires_grad_(True)
    v2 = v_theta.clone().requires_grad_(True)
    out = nft_loss(v1, v_old, x_t, x0, t, adv, 1.0, 5.0)
    ref, _, _, wp, wn = reference_nft(v2, v_old, x_t, x0, t, adv, 1.0, 5.0)
    assert wp[0] == 1e-5 and wn[0] == 1e-5
    assert float(out.weight_pos[0]) == 1e-5 and float(out.weight_neg[0]) == 1e-5
    assert float(out.weight_pos[1]) > 1e-3  # the others are not clamped
    assert abs(out.loss.item() - ref.item()) < TOL
    out.loss.backward()
    ref.backward()
    torch.testing.assert_close(v1.grad, v2.grad, atol=TOL, rtol=0)
    # the weights are detached: differentiating through them gives another gradient
    v3 = v_theta.clone().requires_grad_(True)
    vp = v3  # beta = 1
    err = (x_t - t.view(-1, 1, 1, 1) * vp - x0).flatten(1)
    w = err.abs().mean(1).clamp(min=1e-5)  # NOT detached
    r = 0.5 + 0.5 * (adv / 5.0).clamp(-1, 1)
    vn = 2 * v_old - v3
    errn = (x_t - t.view(-1, 1, 1, 1) * vn - x0).flatten(1)
    wn_ = errn.abs().mean(1).clamp(min=1e-5)
    wrong = (r * err.square().mean(1) / w + (1 - r) * errn.square().mean(1) / wn_).mean() * 5.0
    wrong.backward()
    assert not torch.allclose(v3.grad, v1.grad, atol=1e-4)


def test_positive_advantage_pulls_the_prediction_to_the_sample_and_zero_advantage_is_neutral() -> (
    None
):
    v_theta, v_old, x_t, x0, t, _ = _inputs(b=3)
    v_theta = v_old.clone()  # on-policy: v_θ = v_old

    def x0_error(v):
        return (x_t - t.view(-1, 1, 1, 1) * v - x0).flatten(1).square().mean(1)

    grads = {}
    for a in (5.0, -5.0, 0.0):
        v = v_theta.clone().requires_grad_(True)
        nft_loss(
            v, v_old, x_t, x0, t, torch.full((3,), a, dtype=torch.float64), 1.0, 5.0
        ).loss.backward()
        grads[a] = v.grad
    assert float(grads[0.0].abs().max()) < 1e-12  # r = ½: the two halves cancel
    before = x0_error(v_theta)
    assert bool((x0_error(v_theta - 0.01 * grads[5.0]) < before).all())
    assert bool((x0_error(v_theta - 0.01 * grads[-5.0]) > before).all())


# --------------------------------------------------------------------------- EMA schedules


def test_old_adapter_ema_schedules() -> None:
    assert [OldAdapterEMA(kind="copy").decay(i) for i in (0, 5, 10**6)] == [0.0, 0.0, 0.0]
    linear = OldAdapterEMA(kind="linear", start=0.2, end=0.6, ramp_rollouts=4, delay_rollouts=2)
    got = [linear.decay(i) for i in range(9)]
    want = [0.0, 0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.6]
    assert got == pytest.approx(want, abs=1e-12)
    # the DiffusionNFT code's type 1 (0.001 per step up to 0.5) and type 2 (flat 75 steps)
    assert OldAdapterEMA(kind="linear", start=0.0, end=0.5, ramp_rollouts=500).decay(
        100
    ) == pytest.approx(0.1)
    t2 = OldAdapterEMA(kind="linear", start=0.0, end=0.999, ramp_rollouts=133, delay_rollouts=75)
    assert t2.decay(74) == 0.0 and t2.decay(75) == 0.0 and t2.decay(208) == pytest.approx(0.999)
    warm = OldAdapterEMA(kind="warmup", end=0.9, delay_rollouts=3)
    assert [warm.decay(i) for i in range(5)] == [0.0, 0.0, 0.0, 0.9, 0.9]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "cosine"}, "algorithm.ema.kind"),
        ({"end": 1.0}, "algorithm.ema.end"),
        ({"start": -0.1}, "algorithm.ema.start"),
        ({"ramp_rollouts": 0}, "algorithm.ema.ramp_rollouts"),
        ({"delay_rollouts": -1}, "algorithm.ema.delay_rollouts"),
    ],
)
def test_old_adapter_ema_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OldAdapterEMA(**kwargs)


# --------------------------------------------------------------------------- seeded noise


def test_noise_is_keyed_by_sample_content_and_rollout_index() -> None:
    x0 = torch.randn(4, *LATENT, generator=torch.Generator().manual_seed(0))
    kw = dict(seed=7, num_train_timesteps=3, num_schedule_steps=5)
    eps, u, slots = draw_training_noise(x0, rollout_index=2, **kw)
    assert eps.shape == (4, 3, *LATENT) and u.shape == (4, 3) and slots.shape == (4, 3)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    for row in slots.tolist():  # K distinct steps of the T-step schedule per sample
        assert len(set(row)) == 3 and all(0 <= j < 5 for j in row)
    assert len({tuple(r) for r in slots.tolist()}) > 1  # not the same subset for everyone
    perm = torch.tensor([2, 0, 3, 1])
    eps_p, u_p, slots_p = draw_training_noise(x0[perm], rollout_index=2, **kw)
    assert torch.equal(eps_p, eps[perm]) and torch.equal(u_p, u[perm])  # shuffle / micro-batch free
    assert torch.equal(slots_p, slots[perm])
    eps_2, _, _ = draw_training_noise(x0[:2], rollout_index=2, **kw)
    assert torch.equal(eps_2, eps[:2])
    eps_r, _, _ = draw_training_noise(x0, rollout_index=3, **kw)
    eps_s, _, _ = draw_training_noise(x0, rollout_index=2, **{**kw, "seed": 8})
    assert not torch.equal(eps_r, eps) and not torch.equal(eps_s, eps)
    assert not torch.equal(eps[0], eps[1])
    _, u_u, none = draw_training_noise(x0, rollout_index=2, seed=7, num_train_timesteps=3)
    assert none is None and torch.equal(u_u, u)
    with pytest.raises(ValueError, match="cannot draw 6 distinct steps"):
        draw_training_noise(
            x0, rollout_index=2, seed=7, num_train_timesteps=6, num_schedule_steps=5
        )


# --------------------------------------------------------------------------- with the real backend


class TinyTransformerPipeline:
    """``predict_velocity`` over the tiny SD3 transformer the backend wraps; ODE strategy."""

    def __init__(self, bundle: TinyBundle, strategy=None) -> None:
        self.bundle = bundle
        self.strategy = strategy if strategy is not None else ODE()

    def predict_velocity(self, latents, sigma, conditions: TextEmbedConditions) -> torch.Tensor:
        return self.bundle.transformer(
            hidden_states=latents,
            encoder_hidden_states=conditions.embeds,
            pooled_projections=conditions.pooled,
            timestep=sigma * 1000.0,
        ).sample.float()


def _backend(extra: tuple[str, ...] = ("old",), seed: int = 0) -> tuple[FSDPBackend, TinyBundle]:
    bundle = TinyBundle()
    backend = FSDPBackend(
        bundle=bundle,
        lora=LoraConfig(rank=4, alpha=8.0, targets=list(TARGETS), extra_adapters=list(extra)),
        optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0),
        param_dtype="fp32",
        seed=seed,
    )
    return backend, bundle


def _move_trained_adapter(backend: FSDPBackend, scale: float = 0.05) -> None:
    """Make "default" differ from "old" (the LoRA B matrices start at zero)."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in backend.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _batch(b: int = 4, steps: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    cond = TextEmbedConditions(
        embeds=torch.randn(b, 5, TINY_CONFIG["joint_attention_dim"], generator=g),
        pooled=torch.randn(b, TINY_CONFIG["pooled_projection_dim"], generator=g),
    )
    segment = LatentSegment(
        sigmas=flow_match_sigmas(steps, shift=3.0),
        sde_indices=torch.zeros((b, 0), dtype=torch.long),
        final_latents=torch.randn(b, *LATENT, generator=g),
        guidance_scale=1.0,
        strategy="ode",
    )
    adv = torch.tensor([1.5, -0.5, 3.0, -6.0])[:b]
    return cond, segment, adv


def _algo(bundle: TinyBundle, backend: FSDPBackend, **kw) -> DiffusionNFT:
    algo = DiffusionNFT(pipeline=TinyTransformerPipeline(bundle), **kw)
    algo.bind_backend(backend)
    return algo


def _adapter_tensors(backend: FSDPBackend, name: str) -> dict[str, torch.Tensor]:
    return {
        n.replace(f".{name}.", ".*."): p.detach().clone()
        for n, p in backend.module.named_parameters()
        if f".lora_A.{name}." in n or f".lora_B.{name}." in n
    }


def test_rollout_runs_under_the_old_adapter_and_eval_under_the_trained_one() -> None:
    """The loss node declares the sampling adapter; the trainer's TrainOps switches it."""
    from unirl.trainer.roles import TrainOps

    backend, bundle = _backend()
    _move_trained_adapter(backend)
    algo = _algo(bundle, backend)
    ops = TrainOps(backend=backend, pipeline=algo.pipeline, algorithm=algo)
    cond, segment, _ = _batch()
    x, t = segment.final_latents, torch.full((4,), 0.5)
    pipe = algo.pipeline
    assert algo.sampling_adapter("train") == "old" and algo.sampling_adapter("eval") is None
    with torch.no_grad():
        v_default = pipe.predict_velocity(x, t, cond)
        with backend.set_active_adapter("old"):
            v_old = pipe.predict_velocity(x, t, cond)
        assert not torch.allclose(v_default, v_old, atol=1e-4)
        assert ops.begin_sampling("train") == "old"
        assert torch.equal(pipe.predict_velocity(x, t, cond), v_old)
        ops.end_sampling()
        assert torch.equal(pipe.predict_velocity(x, t, cond), v_default)
        assert ops.begin_sampling("eval") is None
        assert torch.equal(pipe.predict_velocity(x, t, cond), v_default)
        ops.end_sampling()
        ops.begin_sampling("train")  # a rollout that raised never called end_sampling ...
        ops.begin_sampling("eval")  # ... the next begin_sampling undoes it first
        assert torch.equal(pipe.predict_velocity(x, t, cond), v_default)
    assert all(p.requires_grad for p in backend.trainable_parameters())


@pytest.mark.parametrize("kl_beta", [0.0, 0.3])
def test_loss_matches_an_independent_computation_and_trains_only_the_default_adapter(
    kl_beta: float,
) -> None:
    backend, bundle = _backend()
    _move_trained_adapter(backend)
    algo = _algo(
        bundle,
        backend,
        beta=0.5,
        num_train_timesteps=3,
        timestep_sampling="uniform",
        t_min=0.05,
        t_max=0.95,
        kl=KLConfig(beta=kl_beta),
        seed=4,
    )
    cond, segment, adv = _batch()
    algo.start_rollout(2)  # what the train stack does before training rollout 2
    result = algo.compute_loss_and_backward(cond, segment, adv, loss_scale=1.0)

    x0 = segment.final_latents.double()
    eps, u, _ = draw_training_noise(
        segment.final_latents, seed=4, rollout_index=2, num_train_timesteps=3
    )
    times = 0.05 + 0.9 * u
    pipe, expected = algo.pipeline, 0.0
    for k in range(3):
        t = times[:, k]
        x_t = (1 - t.view(-1, 1, 1, 1)) * segment.final_latents + t.view(-1, 1, 1, 1) * eps[:, k]
        with torch.no_grad():
            with backend.set_active_adapter("old"):
                v_old = pipe.predict_velocity(x_t, t, cond)
            with backend.adapter_disabled():
                v_ref = pipe.predict_velocity(x_t, t, cond)
        v = pipe.predict_velocity(x_t, t, cond).double()
        ref, *_ = reference_nft(
            v, v_old.double(), x_t.double(), x0, t.double(), adv.double(), 0.5, 5.0
        )
        ref = ref + kl_beta * (v - v_ref.double()).square().flatten(1).mean(1).mean()
        expected += float(ref.detach()) / 3
    assert abs(result.loss - expected) < 1e-5 * abs(expected)
    assert result.terms["t"].shape == (12,) and torch.equal(result.terms["t"], times.T.reshape(-1))
    assert ("kl" in result.terms) == (kl_beta > 0)
    for name, p in backend.module.named_parameters():
        trained = ".lora_A.default." in name or ".lora_B.default." in name
        assert (p.grad is not None) == trained, name
    assert any(float(p.grad.abs().max()) > 0 for p in backend.trainable_parameters())
    metrics = algo.summarize(result.terms)
    for key in (
        "policy_loss",
        "nft/positive_loss",
        "nft/negative_loss",
        "nft/weight_pos/mean",
        "nft/weight_neg/max",
        "nft/weight_clamped",
        "nft/r_mean",
        "nft/t_mean",
    ):
        assert key in metrics, key
    assert metrics["nft/weight_clamped"] == 0.0
    assert ("kl_loss" in metrics) == (kl_beta > 0)


def test_schedule_times_are_distinct_schedule_sigmas_and_micro_batching_does_not_change_the_terms() -> (
    None
):
    backend, bundle = _backend()
    _move_trained_adapter(backend)
    algo = _algo(bundle, backend, num_train_timesteps=4, timestep_sampling="schedule")
    cond, segment, adv = _batch(steps=5)
    algo.start_rollout(0)
    times, _ = algo.training_times(segment)
    _, _, slots = draw_training_noise(
        segment.final_latents, seed=0, rollout_index=0, num_train_timesteps=4, num_schedule_steps=5
    )
    assert torch.equal(times, segment.sigmas.float()[slots])
    assert all(len(set(row)) == 4 for row in times.tolist()) and float(times.min()) > 0.0
    whole = algo.compute_loss_and_backward(cond, segment, adv, loss_scale=1.0)
    backend.zero_grad()
    perm = torch.tensor([3, 1, 0, 2])
    halves = [
        algo.compute_loss_and_backward(
            cond.select(idx), segment.select(idx), adv[idx], loss_scale=0.5
        )
        for idx in (perm[:2], perm[2:])
    ]
    assert abs(whole.loss - sum(h.loss for h in halves)) < 1e-5 * abs(whole.loss)
    # terms are [K × micro-batch]; sample i's positive term at time k must agree
    w = whole.terms["positive"].view(4, 4)
    h = torch.cat([x.terms["positive"].view(4, 2) for x in halves], dim=1)
    torch.testing.assert_close(h, w[:, perm], atol=1e-5, rtol=1e-5)
    algo.num_train_timesteps = 6
    with pytest.raises(ValueError, match="num_train_timesteps=6 exceeds"):
        algo.training_times(segment)


def test_after_train_moves_the_old_adapter_by_the_schedule() -> None:
    backend, bundle = _backend()
    algo = _algo(bundle, backend, ema=OldAdapterEMA(kind="warmup", end=0.75, delay_rollouts=1))
    _move_trained_adapter(backend)
    new = _adapter_tensors(backend, "default")
    assert algo.after_train(0) == {"nft/old_decay": 0.0}  # copy
    for k, v in _adapter_tensors(backend, "old").items():
        assert torch.equal(v, new[k]), k
    _move_trained_adapter(backend, scale=0.1)
    old1, new = _adapter_tensors(backend, "old"), _adapter_tensors(backend, "default")
    assert algo.after_train(1) == {"nft/old_decay": 0.75}
    for k, v in _adapter_tensors(backend, "old").items():
        torch.testing.assert_close(v, 0.75 * old1[k] + 0.25 * new[k], atol=1e-7, rtol=0)
    assert all(not p.requires_grad for n, p in backend.module.named_parameters() if ".old." in n)


def test_wiring_errors_name_the_fix() -> None:
    backend, bundle = _backend(extra=())
    with pytest.raises(ConfigError, match=r"backend\.lora\.extra_adapters=\[old\]"):
        _algo(bundle, backend)
    with pytest.raises(ConfigError, match="needs LoRA"):
        DiffusionNFT(pipeline=TinyTransformerPipeline(bundle)).bind_backend(
            SimpleNamespace(has_lora=False)
        )
    with pytest.raises(ConfigError, match=r"pipeline\.strategy\._target_=unirl\.sde\.ODE"):
        DiffusionNFT(pipeline=TinyTransformerPipeline(bundle, strategy=FlowSDE(eta=0.7)))
    for kwargs, message in (
        ({"beta": 0.0}, "algorithm.beta"),
        ({"adv_clip_max": -1.0}, "algorithm.adv_clip_max"),
        ({"num_train_timesteps": 0}, "algorithm.num_train_timesteps"),
        ({"timestep_sampling": "logit_normal"}, "algorithm.timestep_sampling"),
        ({"t_min": 0.5, "t_max": 0.5}, "algorithm.t_min"),
        ({"kl": {"beta": -1.0}}, r"algorithm\.kl\.beta"),
        ({"ema": {"kind": "linear", "end": 2.0}}, "algorithm.ema.end"),
    ):
        with pytest.raises(ConfigError, match=message):
            DiffusionNFT(pipeline=TinyTransformerPipeline(bundle), **kwargs)
    backend, bundle = _backend()
    algo = DiffusionNFT(pipeline=TinyTransformerPipeline(bundle), old_adapter="default")
    with pytest.raises(ConfigError, match="is the trained adapter"):
        algo.bind_backend(backend)
    with pytest.raises(ConfigError, match="num_updates_per_batch=1"):
        TrainStack(
            backend=backend,
            algorithm=DiffusionNFT(pipeline=TinyTransformerPipeline(bundle)),
            num_updates_per_batch=2,
        )
    fresh = DiffusionNFT(pipeline=TinyTransformerPipeline(bundle))
    fresh.bind_backend(backend)
    cond, segment, adv = _batch()
    with pytest.raises(RuntimeError, match="start_rollout"):
        fresh.compute_loss_and_backward(cond, segment, adv, loss_scale=1.0)
    assert DiffusionNFT.requires_log_prob is False and DiffusionNFT.supports_multi_update is False
    assert DiffusionNFT.requires_ema_rollout is True
