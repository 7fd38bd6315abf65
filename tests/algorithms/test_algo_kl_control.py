"""The KL-to-reference controller: the adaptive rule step by step, rank averaging, resumable
state, and its wiring into FlowGRPO / FlowDPPO / DiffusionNFT (per-step KL metrics, β used by
the next rollout's loss)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from flow_fakes import make_pipeline, perturbed, run_update, sample, zero_grad

from unirl.algorithms import DRPO, GRPO, DiffusionNFT, FlowDPPO, FlowGRPO
from unirl.algorithms.kl import KLConfig, KLController, adaptive_beta
from unirl.config import ConfigError
from unirl.sde import ODE

ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])
TOL = 1e-6


def _observe_rollout(ctrl: KLController, kl: float) -> dict[str, float]:
    ctrl.observe(torch.full((3,), kl, dtype=torch.float64))
    return ctrl.step()


# --------------------------------------------------------------------------- the controller


def test_adaptive_rule_gives_the_hand_computed_beta_sequence() -> None:
    # β0 = 0.1, target 0.01, horizon 2: e = clip(KL/0.01 − 1, ±0.2), β ← β·(1 + e/2)
    ctrl = KLController(KLConfig(beta=0.1, control="adaptive", target=0.01, horizon=2))
    kls = [0.02, 0.005, 0.011, 0.01, 0.0, 0.0108]
    expected = [
        0.1 * 1.1,  # e = +1.0 clipped to +0.2
        0.11 * 0.9,  # e = −0.5 clipped to −0.2
        0.099 * 1.05,  # e = +0.1
        0.10395,  # e = 0: unchanged
        0.10395 * 0.9,  # KL = 0: e = −1 clipped
        0.093555 * 1.04,  # e = +0.08
    ]
    got = [_observe_rollout(ctrl, kl)["kl/beta_next"] for kl in kls]
    assert got == pytest.approx(expected, rel=1e-12, abs=0)
    assert ctrl.beta == got[-1] and ctrl.updates == len(kls)
    assert adaptive_beta(0.5, 3.0, 1.0, 4.0) == pytest.approx(0.5 * 1.05, rel=1e-15)


def test_adaptive_beta_rises_above_target_and_falls_below() -> None:
    up = KLController(KLConfig(beta=0.04, control="adaptive", target=1e-3, horizon=5))
    down = KLController(KLConfig(beta=0.04, control="adaptive", target=1e-3, horizon=5))
    ups = [_observe_rollout(up, 2e-3)["kl/beta_next"] for _ in range(5)]
    downs = [_observe_rollout(down, 5e-4)["kl/beta_next"] for _ in range(5)]
    assert all(b > a for a, b in zip([0.04, *ups], ups))
    assert all(b < a for a, b in zip([0.04, *downs], downs))
    assert ups[-1] == pytest.approx(0.04 * 1.04**5, rel=1e-12)  # e = +0.2, horizon 5
    assert downs[-1] == pytest.approx(0.04 * 0.96**5, rel=1e-12)  # e = −0.5 clipped to −0.2


def test_step_averages_every_observed_value_and_skips_nonfinite() -> None:
    ctrl = KLController(KLConfig(beta=0.1, control="adaptive", target=2.0, horizon=1))
    ctrl.observe(torch.tensor([1.0, 2.0]))
    ctrl.observe(torch.tensor([[6.0, float("nan")]]))  # NaN not counted
    out = ctrl.step()
    assert out["kl/rollout_mean"] == 3.0  # (1 + 2 + 6) / 3, not a mean of batch means
    assert out["kl/beta_next"] == pytest.approx(0.1 * 1.2, rel=1e-15)
    empty = ctrl.step()  # accumulators were reset; nothing observed → β unchanged
    assert math.isnan(empty["kl/rollout_mean"]) and empty["kl/beta_next"] == out["kl/beta_next"]


def test_fixed_and_disabled_controllers() -> None:
    fixed = KLController(KLConfig(beta=0.04))
    assert _observe_rollout(fixed, 5.0) == {"kl/rollout_mean": 5.0, "kl/beta_next": 0.04}
    assert fixed.beta == 0.04 and fixed.updates == 0
    off = KLController(KLConfig(beta=0.0))
    off.observe(torch.ones(2))
    assert not off.enabled and off.step() == {}


def test_config_validation() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.kl\.control must be 'fixed' or 'adaptive'"):
        KLConfig(beta=0.1, control="pid")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"algorithm\.kl\.beta must be > 0 \(the initial β\)"):
        KLConfig(beta=0.0, control="adaptive", target=0.1)
    with pytest.raises(ConfigError, match=r"algorithm\.kl\.target must be a KL > 0"):
        KLConfig(beta=0.1, control="adaptive")
    with pytest.raises(ConfigError, match=r"algorithm\.kl\.horizon must be >= 1"):
        KLConfig(beta=0.1, control="adaptive", target=0.1, horizon=0.5)
    with pytest.raises(
        ConfigError, match=r"algorithm\.kl\.target is used only by kl\.control=adapt"
    ):
        KLConfig(beta=0.1, target=0.1)
    with pytest.raises(ConfigError, match=r"algorithm\.kl\.beta must be >= 0"):
        KLConfig(beta=-0.1)
    pipeline = make_pipeline()
    with pytest.raises(ConfigError, match=r"kl\.target"):
        FlowGRPO(pipeline=pipeline, kl=KLConfig(beta=0.1, control="adaptive"))
    with pytest.raises(ConfigError, match=r"kl\.control"):  # a Hydra mapping, not the dataclass
        FlowDPPO(pipeline=pipeline, kl={"beta": 0.1, "control": "auto"})
    with pytest.raises(ConfigError, match=r"algorithm\.kl must be a KLConfig block"):
        FlowGRPO(pipeline=pipeline, kl=0.1)  # type: ignore[arg-type]


def test_every_loss_takes_the_same_kl_block() -> None:
    """One ``algorithm.kl`` surface: the dataclass, a mapping (with or without ``_target_``)
    or nothing (KL off) configure the same controller in every loss."""
    policy = SimpleNamespace(token_log_probs=lambda conditions, segment: None)
    pipeline = make_pipeline()
    block = {
        "_target_": "unirl.algorithms.KLConfig",
        "beta": 0.1,
        "control": "adaptive",
        "target": 0.5,
        "horizon": 4,
    }
    algos = [
        FlowGRPO(pipeline=pipeline, kl=block),
        FlowDPPO(
            pipeline=pipeline, kl=KLConfig(beta=0.1, control="adaptive", target=0.5, horizon=4)
        ),
        DiffusionNFT(pipeline=SimpleNamespace(strategy=ODE()), kl=block),
        GRPO(policy=policy, kl=block),
        DRPO(policy=policy, kl=block),
    ]
    for algo in algos:
        ctrl = algo.kl_controller
        assert (ctrl.enabled, ctrl.control, ctrl.beta, ctrl.target, ctrl.horizon) == (
            True,
            "adaptive",
            0.1,
            0.5,
            4.0,
        )
    assert not FlowGRPO(pipeline=pipeline).kl_controller.enabled


def test_state_round_trip() -> None:
    ctrl = KLController(KLConfig(beta=0.1, control="adaptive", target=0.01, horizon=3))
    for kl in (0.05, 0.02, 0.001):
        _observe_rollout(ctrl, kl)
    state = ctrl.state_dict()
    fresh = KLController(KLConfig(beta=0.1, control="adaptive", target=0.01, horizon=3))
    fresh.load_state_dict(state)
    assert (fresh.beta, fresh.updates) == (ctrl.beta, ctrl.updates) and fresh.beta != 0.1
    # both continue identically
    assert _observe_rollout(fresh, 0.03) == _observe_rollout(ctrl, 0.03)

    # through the algorithm: state_dict / load_state_dict (what algorithm_state carries)
    pipeline = make_pipeline()
    kwargs = dict(pipeline=pipeline, kl=KLConfig(beta=0.1, control="adaptive", target=0.01))
    algo = FlowGRPO(**kwargs)
    algo.kl_controller.observe(torch.tensor([0.5]))
    algo.after_train(0)
    saved = algo.state_dict()
    assert saved == {"kl_controller": {"control": "adaptive", "beta": 0.1 * 1.02, "updates": 1}}
    resumed = FlowGRPO(**kwargs)
    resumed.load_algorithm_state(saved)  # the BROADCAST hook, called locally
    assert resumed.kl_controller.beta == algo.kl_controller.beta
    assert resumed.algorithm_state() == saved
    with pytest.raises(ValueError, match="no KL-controller state"):
        FlowGRPO(**kwargs).load_state_dict({})
    with pytest.raises(ValueError, match="unknown algorithm state"):
        FlowGRPO(**kwargs).load_state_dict({**saved, "extra": 1})
    # a fixed β is the configuration: resuming with another kl.beta takes the new one
    fixed = FlowGRPO(pipeline=pipeline, kl=KLConfig(beta=0.02))
    fixed.load_state_dict({"kl_controller": {"control": "fixed", "beta": 0.04, "updates": 0}})
    assert fixed.kl_controller.beta == 0.02
    off = {"kl_controller": {"control": "fixed", "beta": 0.0, "updates": 0}}
    assert FlowGRPO(pipeline=pipeline).state_dict() == off


def _rank_worker(rank: int, world: int, init: str, results: dict) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        ctrl = KLController(KLConfig(beta=0.1, control="adaptive", target=1.0, horizon=1))
        ctrl.observe(torch.full((1 + rank,), 0.5 + rank))  # rank 0: [0.5]; rank 1: [1.5, 1.5]
        results[rank] = ctrl.step()
        torch.distributed.barrier()  # leave together (see tests/train/test_train_fsdp.py)
    finally:
        torch.distributed.destroy_process_group()


def test_ranks_average_the_kl_and_agree_on_beta(tmp_path) -> None:
    init = f"file://{tmp_path / 'rendezvous'}"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_worker, args=(2, init, results), nprocs=2, join=True)
        got = dict(results)
    mean = (0.5 + 1.5 + 1.5) / 3  # weighted by count over ranks
    assert got[0] == got[1]
    assert got[0]["kl/rollout_mean"] == pytest.approx(mean, rel=1e-15)
    assert got[0]["kl/beta_next"] == pytest.approx(0.1 * (1 + (mean - 1.0)), rel=1e-12)


# --------------------------------------------------------------------------- in the losses


def _independent_slot_kls(pipeline, conditions, segment) -> torch.Tensor:
    """``KL[N, S]``: policy vs reference means of every slot, the Gaussian form of docs/math.md."""
    sigmas = segment.sigmas.double()
    cols = []
    for k in range(segment.num_sde_steps):
        with torch.no_grad():
            mean = pipeline.replay(conditions, segment, k).mean.double()
            with perturbed(pipeline.bundle):
                ref = pipeline.replay(conditions, segment, k).mean.double()
        idx = segment.sde_indices[:, k]
        s, s_next, s_max = sigmas[idx], sigmas[idx + 1], float(sigmas[1])
        denom = torch.where(s == 1.0, torch.full_like(s, s_max), s)
        std = pipeline.strategy.eta * torch.sqrt(s / (1 - denom)) * torch.sqrt(s - s_next)
        d = (mean - ref).reshape(len(mean), -1).square().mean(1)
        cols.append(d / (2 * std**2))
    return torch.stack(cols, dim=1)


@pytest.mark.parametrize("cls", [FlowGRPO, FlowDPPO])
def test_per_step_kl_metrics_and_adaptive_beta_in_the_next_loss(cls) -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = cls(pipeline=pipeline, kl=KLConfig(beta=0.05, control="adaptive", target=1e-9))
    algo.bind_reference(lambda: perturbed(pipeline.bundle))
    terms = run_update(algo, conditions, segment, 4, ADV)
    metrics = algo.summarize(terms)
    expected = _independent_slot_kls(pipeline, conditions, segment)
    steps = segment.num_sde_steps
    assert terms["kl_steps"].shape == (4, steps)
    for k in range(steps):
        assert metrics[f"kl/step_{k}"] == pytest.approx(float(expected[:, k].mean()), rel=TOL)
    assert f"kl/step_{steps}" not in metrics
    assert metrics["kl/beta"] == 0.05
    assert metrics["kl_loss"] == pytest.approx(float(expected.mean()), rel=TOL)

    out = algo.after_train(0)
    assert out["kl/rollout_mean"] == pytest.approx(float(expected.mean()), rel=TOL)
    assert out["kl/beta_next"] == pytest.approx(0.05 * 1.02, rel=1e-12)  # KL ≫ target: e = +0.2

    zero_grad(pipeline.bundle)
    prepared = algo.prepare_segment(conditions, segment)
    result = algo.compute_loss_and_backward(conditions, prepared, ADV, loss_scale=1.0)
    assert algo.summarize(result.terms)["kl/beta"] == out["kl/beta_next"]
    if cls is FlowGRPO:  # loss = mean_k (mean policy_k + β·mean KL_k), with the new β
        policy = result.terms["policy_loss"].double().reshape(steps, 4).mean(1)
        kl = result.terms["kl"].double().reshape(steps, 4).mean(1)
        want = float((policy + out["kl/beta_next"] * kl).mean())
        assert result.loss == pytest.approx(want, rel=TOL)


def test_flowgrpo_without_kl_has_no_kl_terms_or_after_train_metrics() -> None:
    pipeline = make_pipeline()
    conditions, segment = sample(pipeline)
    algo = FlowGRPO(pipeline=pipeline)
    terms = run_update(algo, conditions, segment, 2, ADV)
    metrics = algo.summarize(terms)
    assert "kl_steps" not in terms and not any(k.startswith("kl") for k in metrics)
    assert algo.after_train(0) == {}


def test_nft_after_train_merges_ema_and_kl_controller() -> None:
    synced = []
    backend = SimpleNamespace(
        device=torch.device("cpu"),
        sync_adapter=lambda name, *, src, decay: synced.append((name, src, decay)),
    )
    algo = DiffusionNFT(
        pipeline=SimpleNamespace(strategy=ODE()),
        ema="copy",
        kl=KLConfig(beta=0.2, control="adaptive", target=0.5, horizon=4),
    )
    algo.backend = backend
    algo.kl_controller.observe(torch.tensor([0.25, 0.25]))  # e = −0.5 → −0.2
    out = algo.after_train(3)
    assert synced == [("old", "default", 0.0)]
    assert out == {"nft/old_decay": 0.0, "kl/rollout_mean": 0.25, "kl/beta_next": 0.2 * 0.95}
    terms = {
        "policy_loss": torch.tensor([1.0]),
        "positive": torch.ones(4),
        "negative": torch.ones(4),
        "weight_pos": torch.ones(4),
        "weight_neg": torch.ones(4),
        "r": torch.ones(4),
        "t": torch.ones(4),
        "kl": torch.tensor([1.0, 2.0, 3.0, 4.0]),
        "kl_steps": torch.tensor([[1.0, 3.0], [2.0, 4.0]]),
    }
    metrics = algo.summarize(terms)
    assert metrics["kl/step_0"] == 1.5 and metrics["kl/step_1"] == 3.5
    assert metrics["kl/beta"] == pytest.approx(0.19, rel=1e-15)
