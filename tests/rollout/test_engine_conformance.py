"""Engine conformance: every engine that runs here answers one request with the request's σ
schedule and x_T, the contract's shapes, and log-probs that agree with a trainside replay.

Tolerances (max |Δ log p| per sample and step; log p is a mean over C·H·W): fp32 engine copy
on CPU vs the fp32 trainer — asserted <= 1e-6 (observed exactly 0: same kernels, same
geometry); bf16 engine copy vs the fp32 trainer — asserted <= 1e-2 (observed 9e-4 on the tiny
preset; bf16 rounding of weights and activations moves the velocity). GPU bf16 runs of the
real model should be judged against the bf16 bound.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from rollout_fakes import (
    BUNDLE_BLOCK,
    PIPELINE_BLOCK,
    make_request,
    stage,
    sync_in_process,
    trainside_stack,
)

from unirl.distributed.weight_sync import LoraSync
from unirl.rollout import DedicatedEngine, TrainsideEngine
from unirl.types import Images, LatentSegment, RolloutResp
from unirl.types.resident import RESIDENT, unpark

TOL = {"fp32": 1e-6, "bf16": 1e-2}


@pytest.fixture(scope="module")
def stack():
    bundle, backend, pipeline = trainside_stack()
    req = make_request(bundle.scheduler_config, bundle.latent_shape(64, 64))
    return bundle, backend, pipeline, req


def _check_contract(resp: RolloutResp, req) -> LatentSegment:
    assert set(resp.tracks) == {"diffusion"}
    track = resp.tracks["diffusion"]
    diffusion = stage(req)
    n, s = diffusion.sde_indices.shape
    assert torch.equal(track.sample_ids, req.sample_ids) and torch.equal(
        track.group_ids, req.group_ids
    )
    seg = track.segment
    assert isinstance(seg, LatentSegment)
    assert torch.equal(
        seg.sigmas, diffusion.sigmas.float()
    )  # the request's schedule, not the engine's own
    assert torch.equal(seg.sde_indices, diffusion.sde_indices)
    c, h, w = diffusion.init_noise_shape
    assert tuple(seg.latents.shape) == (n, s, c, h, w) == tuple(seg.next_latents.shape)
    assert tuple(seg.sde_logp.shape) == (n, s) and seg.sde_logp.dtype == torch.float32
    assert tuple(seg.final_latents.shape) == (n, c, h, w)
    # step 0 is trained, so latents[:, 0] is the x_T the engine started from
    assert torch.equal(seg.latents[:, 0].float(), diffusion.initial_noise(req.seed))
    assert isinstance(track.decoded, Images) and tuple(track.decoded.pixels.shape) == (n, 3, 64, 64)
    assert torch.isfinite(seg.sde_logp).all()
    return seg


def _replay_logp(pipeline, track) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack(
            [
                pipeline.replay(track.conditions, track.segment, k).log_prob
                for k in range(track.segment.num_sde_steps)
            ],
            dim=1,
        )


@pytest.mark.parametrize("resident", [True, False])
def test_trainside_matches_its_own_replay(stack, resident: bool) -> None:
    _, _, pipeline, req = stack
    resp = TrainsideEngine(pipeline=pipeline, resident=resident).generate(req)
    track = resp.tracks["diffusion"]
    if resident:  # the training inputs stayed on the worker; only the key crossed
        assert track.conditions is None and track.segment is None
        assert track.resident_key == f"rollout_{req.rollout_index}/diffusion"
        resp = dataclasses.replace(resp, tracks={"diffusion": unpark(track)})
        RESIDENT.drop(track.resident_key)
    else:
        assert track.resident_key is None
    seg = _check_contract(resp, req)
    replay = _replay_logp(pipeline, resp.tracks["diffusion"])
    assert torch.equal(replay, seg.sde_logp)  # equal geometry: bit for bit


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dedicated_engine_agrees_with_trainside_replay(stack, dtype: str) -> None:
    _, backend, pipeline, req = stack
    engine = DedicatedEngine(
        bundle=dict(BUNDLE_BLOCK), pipeline=dict(PIPELINE_BLOCK), dtype=dtype, device="cpu"
    )
    sync_in_process(LoraSync(), backend, engine)
    resp = engine.generate(req)
    seg = _check_contract(resp, req)
    track = resp.tracks["diffusion"]
    # replay under the *trainer's* weights, on the engine's own trajectory and conditions
    conditions = track.conditions.to(torch.device("cpu"))
    track = dataclasses.replace(track, conditions=conditions)
    replay = _replay_logp(pipeline, track)
    delta = (replay - seg.sde_logp).abs().max().item()
    assert delta <= TOL[dtype], f"{dtype}: max |Δ log p| = {delta:.3e} > {TOL[dtype]}"
    if dtype == "fp32":
        trainside = TrainsideEngine(pipeline=pipeline, resident=False).generate(req)
        trainside = trainside.tracks["diffusion"]
        assert torch.equal(trainside.segment.sde_logp, seg.sde_logp)
        assert torch.equal(trainside.segment.final_latents, seg.final_latents)


def test_dedicated_engine_without_sync_differs(stack) -> None:
    """The check above can fail: an engine that never received the adapter samples differently."""
    _, _, pipeline, req = stack
    engine = DedicatedEngine(bundle=dict(BUNDLE_BLOCK), pipeline=dict(PIPELINE_BLOCK), device="cpu")
    track = engine.generate(req).tracks["diffusion"]
    replay = _replay_logp(pipeline, track)
    assert (replay - track.segment.sde_logp).abs().max().item() > 1e-4
