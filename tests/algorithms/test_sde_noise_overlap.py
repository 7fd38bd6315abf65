"""A rollout's SDE noise is drawn on a background thread (``FlowMatchingPipeline.generate``)
and asked for by the denoise loop only at its first stochastic step, so the forwards before
that step are queued while the host still draws it. The samples are those of the noise drawn
up front, bit for bit, chunk by chunk. A forked child gets a thread of its own."""

from __future__ import annotations

import os

import pytest
import torch
from flow_fakes import CHANNELS, EMBED, SIDE, make_pipeline

from unirl.models.common.denoise import sample_trajectory
from unirl.sde import flow_match_sigmas
from unirl.types import (
    DiffusionRequest,
    DiffusionSamplingParams,
    LatentSegment,
    RolloutReq,
    TextEmbedConditions,
    Texts,
    init_noise,
)

FIELDS = ("latents", "next_latents", "final_latents", "sde_logp", "sde_uncond")


def _same(a: LatentSegment, b: LatentSegment) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name


@pytest.mark.parametrize("guidance_scale", [1.0, 4.5])
def test_the_noise_is_asked_for_at_the_first_sde_step(guidance_scale: float) -> None:
    pipeline = make_pipeline(record_uncond=True)
    forwards: list[int] = []
    predict = pipeline.bundle.predict_velocity

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        forwards.append(1)
        return predict(*args, **kwargs)

    pipeline.bundle.predict_velocity = counted
    gen = torch.Generator().manual_seed(3)
    n, steps = 4, 5
    sde_indices = torch.tensor([[2, 3]] * n)
    noise = torch.randn(n, 2, CHANNELS, SIDE, SIDE, generator=gen)
    conditions = TextEmbedConditions(embeds=torch.randn(n, 2, EMBED, generator=gen))
    asked: list[int] = []

    def later() -> torch.Tensor:
        asked.append(len(forwards))
        return noise

    def run(sde_noise: object) -> LatentSegment:
        return sample_trajectory(
            pipeline,
            conditions=conditions,
            x_T=torch.randn(n, CHANNELS, SIDE, SIDE, generator=torch.Generator().manual_seed(4)),
            sigmas=flow_match_sigmas(steps, shift=3.0),
            sde_indices=sde_indices,
            sde_noise=sde_noise,  # type: ignore[arg-type]
            strategy=pipeline.strategy,
            guidance_scale=guidance_scale,
            record_uncond=True,
        )

    upfront = run(noise)
    per_loop = len(forwards)
    forwards.clear()
    lazily = run(later)
    assert asked == [3 * per_loop // steps]  # once, after the forwards of steps 0, 1 and 2
    _same(upfront, lazily)


def test_generate_draws_the_request_noise_chunk_by_chunk() -> None:
    pipeline = make_pipeline()
    pipeline.forward_batch_size = 3  # chunks of 3 and 1 rows
    n, steps, seed, rollout = 4, 5, 11, 7
    params = DiffusionSamplingParams(num_inference_steps=steps, guidance_scale=1.0)
    stage = DiffusionRequest(
        init_noise_ids=torch.arange(10, 10 + n),
        sde_indices=torch.tensor([[0, 2], [1, 3], [0, 2], [1, 3]]),
        sigmas=flow_match_sigmas(steps, shift=3.0),
        init_noise_shape=(CHANNELS, SIDE, SIDE),
    )
    req = RolloutReq(
        sample_ids=torch.arange(10, 10 + n),
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=["a", "bb", "a", "bb"])},
        stage_params={"diffusion": stage},
        sampling_params=params,
        seed=seed,
        rollout_index=rollout,
    )
    segment = pipeline.generate(req).tracks["diffusion"].segment
    assert segment is not None

    noise = init_noise(req.sample_ids, (2, CHANNELS, SIDE, SIDE), seed, stream=f"sde/{rollout}")
    x_T = stage.initial_noise(seed)
    conditions = pipeline.encode(list(req.prompts), params, 1.0)
    chunks = [
        sample_trajectory(
            pipeline,
            conditions=conditions.select(torch.arange(n)[rows]),
            x_T=x_T[rows],
            sigmas=stage.sigmas,
            sde_indices=stage.sde_indices[rows],
            sde_noise=noise[rows],
            strategy=pipeline.strategy,
            guidance_scale=1.0,
        )
        for rows in (slice(0, 3), slice(3, 4))
    ]
    _same(segment, LatentSegment.concat(chunks))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_noise_on_a_thread_of_its_own() -> None:
    from unirl.models.common.pipeline import noise_thread

    assert noise_thread().submit(int).result(timeout=10) == 0  # the parent's thread runs
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker thread was not copied
        try:
            os._exit(0 if noise_thread().submit(lambda: 7).result(timeout=10) == 7 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
