"""Ulysses sequence parallelism (``models/common/sequence_parallel.py``) against the single-rank
run, on 2 and 4 gloo ranks (``torch.multiprocessing`` spawn, CPU, fp32).

Every rank builds the same tiny transformer (tiny Wan 2.1, tiny HunyuanVideo 1.5, tiny
HunyuanVideo 1.0, each with 4 heads so that 4 ranks split them) and the same inputs, runs the
single-rank forward and backward first, then enables SP over the group and runs them again:

- the SP forward (the velocity every rank returns) equals the single-rank one within 1e-5;
- the parameter gradients, averaged over the SP group (what FSDP2's data-parallel mean does),
  equal the single-rank ones within 1e-5 relative to the largest;
- the FlowSDE log-probs of a step from that velocity (the same noise on every rank, as the
  driver authors it per sample id) equal the single-rank ones within 1e-5;
- the tiny Wan bundle's rollout (batched CFG, FlowSDE) with SP switched on through
  ``bundle.enable_sequence_parallel`` records the same final latents and log-probs (2 ranks);
- a mutation that exchanges along the wrong dimension (head_dim instead of heads) fails the
  forward check by far.

Tolerance: the SP attention sees the same rows in another batch geometry ([B, L, H/P, D]
instead of [B, L, H, D]) and the gradient mean sums P partials: float32 reduction order only.
One case (2 ranks, Wan, and the mutation) runs in CI; every family on 2 and 4 ranks is
``slow`` (UNIRL_SLOW=1).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TOL = 1e-5
FAMILIES = ("wan", "hunyuan_video15", "hunyuan_video")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(family: str) -> tuple[torch.nn.Module, dict[str, Any], tuple[int, ...]]:
    """``(transformer, forward kwargs, latent shape)`` of a family's tiny transformer with 4
    heads, seeded (the same on every rank). Text rows are right-padded (masks with zeros)."""
    torch.manual_seed(0)
    b = 2
    if family == "wan":
        from diffusers import WanTransformer3DModel

        from unirl.models.wan.tiny import TinyWanSpec, transformer_config

        spec = dataclasses.replace(TinyWanSpec(), num_attention_heads=4)
        model = WanTransformer3DModel(**transformer_config(spec))
        shape = (b, 16, 2, 4, 6)  # 2 x 2 x 3 = 12 tokens after the 1x2x2 patches
        kwargs = {"encoder_hidden_states": torch.randn(b, 7, spec.text_d_model)}
    elif family == "hunyuan_video15":
        from diffusers import HunyuanVideo15Transformer3DModel

        from unirl.models.hunyuan_video.tiny import TinyHunyuanVideo15Spec, transformer_config

        spec15 = dataclasses.replace(
            TinyHunyuanVideo15Spec(),
            num_attention_heads=4,
            attention_head_dim=16,
            rope_axes_dim=(4, 6, 6),
        )
        model = HunyuanVideo15Transformer3DModel(**transformer_config(spec15))
        shape = (b, 65, 2, 2, 3)  # patch 1: 12 tokens
        mask = torch.ones(b, 6, dtype=torch.long)
        mask[1, 4:] = 0
        glyph_mask = torch.zeros(b, 5, dtype=torch.long)
        glyph_mask[0, :3] = 1
        kwargs = {
            "encoder_hidden_states": torch.randn(b, 6, spec15.text_hidden),
            "encoder_attention_mask": mask,
            "encoder_hidden_states_2": torch.randn(b, 5, spec15.glyph_d_model),
            "encoder_attention_mask_2": glyph_mask,
            "image_embeds": torch.zeros(b, 0, spec15.image_embed_dim),
        }
    else:
        from diffusers import HunyuanVideoTransformer3DModel

        from unirl.models.hunyuan_video_v1.tiny import TinyHunyuanVideoSpec, transformer_config

        spec10 = dataclasses.replace(
            TinyHunyuanVideoSpec(),
            num_attention_heads=4,
            attention_head_dim=16,
            rope_axes_dim=(4, 6, 6),
        )
        model = HunyuanVideoTransformer3DModel(**transformer_config(spec10))
        shape = (b, 16, 2, 4, 6)  # 2x2 patches: 12 tokens
        mask = torch.ones(b, 6)
        mask[1, 4:] = 0
        kwargs = {
            "encoder_hidden_states": torch.randn(b, 6, spec10.text_hidden),
            "encoder_attention_mask": mask,
            "pooled_projections": torch.randn(b, spec10.clip_hidden),
            "guidance": torch.full((b,), 6000.0),
        }
    kwargs["timestep"] = torch.tensor([700.0, 250.0])
    return model, kwargs, shape


def measure(family: str, sp: Any) -> dict[str, float]:
    """Single-rank then SP forward / backward / log-prob of one family; the gaps."""
    from unirl.models.common.sequence_parallel import enable_sequence_parallel
    from unirl.sde import FlowSDE

    model, kwargs, shape = build(family)
    x = torch.randn(shape)
    out_shape = (shape[0], int(model.config.out_channels), *shape[2:])
    weight = torch.randn(out_shape)  # a replicated loss: sum(v * weight)
    noise = torch.randn(out_shape)
    sigma, sigma_next = torch.tensor([0.7, 0.25]), torch.tensor([0.6, 0.15])

    step = FlowSDE(eta=0.7)

    def run(prev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """The velocity, the log-prob of a step (sampled with ``noise``, or ``prev`` replayed)
        and the parameter gradients of the replicated loss."""
        model.zero_grad(set_to_none=True)
        v = model(hidden_states=x, return_dict=False, **kwargs)[0]
        (v * weight).sum().backward()
        latents = x[:, : v.shape[1]]
        if prev is None:
            out = step.step(v.detach(), latents, sigma, sigma_next, noise=noise)
            return v.detach(), out.next_latents, [p.grad.detach().clone() for p in grads_of()]
        out = step.step(v.detach(), latents, sigma, sigma_next, prev_sample=prev)
        return v.detach(), out.log_prob, [p.grad.detach().clone() for p in grads_of()]

    def grads_of() -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.grad is not None]

    v_ref, prev, grads_ref = run(None)
    logp_ref = step.step(
        v_ref, x[:, : v_ref.shape[1]], sigma, sigma_next, prev_sample=prev
    ).log_prob
    handle = enable_sequence_parallel(model, sp)
    v_sp, logp_sp, grads_sp = run(prev)  # the SP policy's log-prob of the single-rank sample
    handle.remove()
    for g in grads_sp:  # the data-parallel mean over the SP group
        dist.all_reduce(g, group=sp.group)
        g.div_(sp.size)
    scale = max(float(g.abs().max()) for g in grads_ref)
    return {
        "forward": float((v_sp - v_ref).abs().max()),
        "logp": float((logp_sp - logp_ref).abs().max()),
        "grads": max(float((a - b).abs().max()) for a, b in zip(grads_sp, grads_ref, strict=True))
        / scale,
        "grad_count": float(len(grads_sp) == len(grads_ref)),
        "moved": float(v_ref.abs().max()),
    }


def measure_pipeline(sp: Any) -> dict[str, float]:
    """The tiny Wan bundle's rollout (batched CFG, FlowSDE, 3 trained steps of 4) without and
    with SP (``bundle.enable_sequence_parallel``): the gaps in final latents and recorded
    log-probs. Every rank builds the same request, so the x_T and the SDE noise are the same."""
    from unirl.models.wan import WanBundle, WanPipeline
    from unirl.sde import FlowSDE
    from unirl.types import DiffusionRequest, DiffusionSamplingParams, RolloutReq, Texts

    bundle = WanBundle(
        path="tiny", dtype="fp32", text_encoder_dtype="fp32", device="cpu", max_sequence_length=16
    )
    pipeline = WanPipeline(bundle=bundle, strategy=FlowSDE(eta=0.7))
    n, steps = 4, 4
    params = DiffusionSamplingParams(
        num_inference_steps=steps,
        guidance_scale=4.0,
        height=32,
        width=48,
        samples_per_prompt=2,
        negative_prompt="",
        num_frames=5,
    )
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.arange(n) // 2,
        primitives={"text": Texts(texts=["a red fox"] * 2 + ["a blue car at night"] * 2)},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor([[0, 1, 2]] * n),
                sigmas=bundle.sigmas(steps, 32, 48),
                init_noise_shape=tuple(bundle.latent_shape_for(params)),
            )
        },
        sampling_params=params,
        seed=5,
    )
    ref = pipeline.generate(req).tracks["diffusion"].segment
    handles = bundle.enable_sequence_parallel(sp)
    out = pipeline.generate(req).tracks["diffusion"].segment
    for handle in handles:
        handle.remove()
    assert ref.sde_logp is not None and out.sde_logp is not None
    assert ref.final_latents is not None and out.final_latents is not None
    return {
        "latents": float((out.final_latents - ref.final_latents).abs().max()),
        "sde_logp": float((out.sde_logp - ref.sde_logp).abs().max()),
        "moved": float(ref.final_latents.abs().max()),
    }


def _worker(rank: int, world: int, port: int, queue: Any, families: tuple[str, ...]) -> None:
    """Measure ``families``, then (when ``wan`` is among them) Wan again with a broken
    exchange: the heads' dim (2) swapped for head_dim (3)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from unirl.models.common import sequence_parallel as ulysses

        sp = ulysses.SequenceParallel.of()
        results = {f: measure(f, sp) for f in families}
        if "wan" in families and world == 2:
            results["wan_pipeline"] = measure_pipeline(sp)
        if "wan" in families:
            exchange = ulysses.all_to_all

            def wrong_dim(
                x: torch.Tensor, sp: Any, *, scatter_dim: int, gather_dim: int
            ) -> torch.Tensor:
                return exchange(
                    x,
                    sp,
                    scatter_dim=3 if scatter_dim == 2 else scatter_dim,
                    gather_dim=3 if gather_dim == 2 else gather_dim,
                )

            ulysses.all_to_all = wrong_dim  # type: ignore[assignment]
            try:
                results["wan_broken_exchange"] = measure("wan", sp)
            finally:
                ulysses.all_to_all = exchange  # type: ignore[assignment]
        queue.put((rank, results))
    finally:
        dist.destroy_process_group()


def spawn(world: int, families: tuple[str, ...]) -> dict[int, dict[str, dict[str, float]]]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        _worker,
        args=(world, _free_port(), queue, families),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return dict(queue.get() for _ in range(world))


def check(
    results: dict[int, dict[str, dict[str, float]]], world: int, families: tuple[str, ...]
) -> None:
    assert sorted(results) == list(range(world))
    for rank, measured in results.items():
        for family in families:
            gaps = measured[family]
            where = (world, rank, family, gaps)
            assert gaps["moved"] > 1e-2, where  # a real output
            assert gaps["grad_count"] == 1.0, where
            assert gaps["forward"] <= TOL, where
            assert gaps["logp"] <= TOL, where
            assert gaps["grads"] <= TOL, where
        if "wan_pipeline" in measured:  # the rollout through the bundle, SP on
            rollout = measured["wan_pipeline"]
            assert rollout["moved"] > 1e-2, rollout
            assert rollout["latents"] <= TOL and rollout["sde_logp"] <= TOL, rollout
        if "wan" in families:  # the mutation is caught by every check
            broken = measured["wan_broken_exchange"]
            assert min(broken["forward"], broken["logp"], broken["grads"]) > 10 * TOL, broken


def test_ulysses_on_two_ranks_equals_one_rank_and_a_wrong_exchange_fails() -> None:
    from unirl.models.wan import tiny_preset_path

    tiny_preset_path()  # built once here, not raced by the ranks
    results = spawn(2, ("wan",))
    assert all("wan_pipeline" in r for r in results.values())
    check(results, 2, ("wan",))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_every_video_family_equals_one_rank(world: int) -> None:
    check(spawn(world, FAMILIES), world, FAMILIES)
