"""On the real tiny SD3 (fp32, CPU): the first update of FlowGRPO is exactly on-policy — ratio
exactly 1 — for the Flow, CPS and Dance kernels, through the real pipeline, backend and stack.

Replay-sourced anchors run the training forward's geometry, so the ratio is exactly 1 under
either ``cfg_gradient``. Rollout-sourced anchors are the sampler's log-probs, from its batched
``[uncond; cond]`` forward: bit-equal to the replay only at equal geometry, i.e. with
``cfg_gradient="both"``. ``cond_only`` replays the unconditional rows as their own N-row
forward, and the tiny SD3's matmuls round differently at N and 2N rows: the sampler-vs-replay
gap is then one float32 ulp of the log-prob (measured 1.19e-7), bounded here by 1e-6.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from unirl.algorithms import FlowGRPO
from unirl.models.sd3 import SD3Bundle, SD3Pipeline
from unirl.sde import CPS, DanceSDE, FlowSDE, RandomSubsetSchedule, sigmas_from_scheduler_config
from unirl.train import FSDPBackend, LoraConfig, OptimizerConfig, TrainStack
from unirl.types import DiffusionRequest, DiffusionSamplingParams, RolloutReq, Texts


@pytest.fixture(scope="module")
def bundle() -> SD3Bundle:
    torch.manual_seed(0)
    return SD3Bundle(
        path="tiny", dtype="fp32", text_encoder_dtype="fp32", device="cpu", max_sequence_length=32
    )


@pytest.mark.parametrize(
    "strategy",
    [FlowSDE(eta=0.7), CPS(eta=0.8), CPS(eta=0.8, log_prob_form="gaussian"), DanceSDE(eta=0.3)],
    ids=str,
)
@pytest.mark.parametrize(
    ("old_logp_source", "cfg_gradient"),
    [("replay", "cond_only"), ("replay", "both"), ("rollout", "both")],
)
def test_first_update_ratio_is_exactly_one(
    bundle: SD3Bundle, strategy, old_logp_source: str, cfg_gradient: str
) -> None:
    local = copy.copy(bundle)
    local.transformer = copy.deepcopy(bundle.transformer)
    backend = FSDPBackend(
        bundle=local,
        lora=LoraConfig(rank=4, alpha=8, targets=["to_q", "to_k", "to_v", "to_out.0"]),
        optimizer=OptimizerConfig(lr=1e-2),
        param_dtype="fp32",
        device="cpu",
    )
    pipeline = SD3Pipeline(bundle=local, strategy=strategy)
    algorithm = FlowGRPO(
        pipeline=pipeline,
        clip_range=1e-3,
        old_logp_source=old_logp_source,
        cfg_gradient=cfg_gradient,
    )
    # one mini-batch whose micro-batch equals the rollout batch: both anchor sources are exact
    stack = TrainStack(
        backend=backend,
        algorithm=algorithm,
        micro_batch_size=8,
        num_updates_per_batch=1,
        shuffle=False,
    )
    n = 8
    params = DiffusionSamplingParams(
        num_inference_steps=6, guidance_scale=4.5, height=64, width=64, samples_per_prompt=4
    )
    steps = RandomSubsetSchedule(num_steps=3, fraction=(0.0, 0.99)).select(6, seed=1)
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 4,
        primitives={"text": Texts(texts=["a red cat"] * 4 + ["a blue dog"] * 4)},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor([list(steps)] * n),
                sigmas=sigmas_from_scheduler_config(
                    local.scheduler_config, 6, image_seq_len=local.image_seq_len(64, 64)
                ),
                init_noise_shape=local.latent_shape(64, 64),
            )
        },
        sampling_params=params,
        seed=5,
    )
    track = pipeline.generate(req).tracks["diffusion"]
    track = dataclasses.replace(track, rewards=torch.arange(n).float())
    track, _ = track.compute_advantages()
    out = stack.train_track(track, 0)
    step = out["steps"][0]
    assert step["ratio/min"] == 1.0 and step["ratio/max"] == 1.0, step
    assert step["approx_kl"] == 0.0
    if cfg_gradient == "both":  # the sampler's geometry: bit for bit
        assert step["old_logp/rollout_vs_replay_max"] == 0.0
    else:  # the unconditional rows in their own forward (see the module docstring)
        assert step["old_logp/rollout_vs_replay_max"] <= 1e-6
    assert step["grad_norm"] > 0  # the update is real
    if old_logp_source == "rollout":  # the same data after the step is off-policy: weights moved
        again = stack.train_track(track, 1)["steps"][0]
        assert again["ratio/min"] != 1.0 or again["ratio/max"] != 1.0


def test_recorded_uncond_is_reused_until_the_first_optimizer_step(bundle: SD3Bundle) -> None:
    """Two mini-batches of one rollout through the real backend: the first reuses the
    rollout's v_u (the version the rollout was stamped with is current), the backend's
    optimizer step bumps the version, the second recomputes it without grad."""
    local = copy.copy(bundle)
    local.transformer = copy.deepcopy(bundle.transformer)
    backend = FSDPBackend(
        bundle=local,
        lora=LoraConfig(rank=4, alpha=8, targets=["to_q", "to_k", "to_v", "to_out.0"]),
        optimizer=OptimizerConfig(lr=1e-2),
        param_dtype="fp32",
        device="cpu",
    )
    pipeline = SD3Pipeline(bundle=local, strategy=FlowSDE(eta=0.7), record_uncond=True)
    algorithm = FlowGRPO(pipeline=pipeline, clip_range=1e-3)
    stack = TrainStack(
        backend=backend,
        algorithm=algorithm,
        micro_batch_size=4,
        num_updates_per_batch=2,
        shuffle=False,
    )
    n = 8
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 4,
        primitives={"text": Texts(texts=["a red cat"] * 4 + ["a blue dog"] * 4)},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor([[1, 3]] * n),
                sigmas=sigmas_from_scheduler_config(
                    local.scheduler_config, 6, image_seq_len=local.image_seq_len(64, 64)
                ),
                init_noise_shape=local.latent_shape(64, 64),
            )
        },
        sampling_params=DiffusionSamplingParams(
            num_inference_steps=6, guidance_scale=4.5, height=64, width=64, samples_per_prompt=4
        ),
        seed=5,
    )
    version = backend.policy_version
    track = pipeline.generate(req).tracks["diffusion"]
    assert track.segment.uncond_version == version
    track = dataclasses.replace(track, rewards=torch.arange(n).float())
    track, _ = track.compute_advantages()
    first, second = stack.train_track(track, 0)["steps"]
    assert first["ratio/min"] == 1.0 == first["ratio/max"]
    assert (first["uncond_reused"], first["uncond_recomputed"]) == (2.0, 0.0)
    assert (second["uncond_reused"], second["uncond_recomputed"]) == (0.0, 2.0)
    assert backend.policy_version == version + 2
