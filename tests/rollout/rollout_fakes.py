"""Shared helpers for the rollout tests: a tiny-SD3 request, a trainside stack, in-process sync."""

from __future__ import annotations

from typing import Any

import torch

from unirl.sde import FlowSDE, sigmas_from_scheduler_config
from unirl.types import DiffusionRequest, DiffusionSamplingParams, RolloutReq, Texts

BUNDLE_BLOCK = {
    "_target_": "unirl.models.sd3.SD3Bundle",
    "path": "tiny",
    "dtype": "fp32",
    "text_encoder_dtype": "fp32",
    "vae_dtype": "fp32",
    "device": "cpu",
    "max_sequence_length": 32,
}
PIPELINE_BLOCK = {
    "_target_": "unirl.models.sd3.SD3Pipeline",
    "strategy": {"_target_": "unirl.sde.FlowSDE", "eta": 0.7},
    "storage_dtype": "fp32",
}
LORA = {"rank": 4, "alpha": 8, "targets": ["to_q", "to_k", "to_v", "to_out.0"]}
PROMPTS = ["a red cube on a table", "a quiet lake at dawn"]


def make_request(
    scheduler_config: dict[str, Any], latent_shape: tuple[int, ...], *, spp: int = 2, steps: int = 6
) -> RolloutReq:
    """2 prompts x ``spp`` samples at 64x64; trained steps 0, 2, 4 (step 0 stores x_T); the
    diffusion block sits under ``stage_params["diffusion"]`` (read it with :func:`stage`)."""
    sampling = DiffusionSamplingParams(
        num_inference_steps=steps,
        guidance_scale=4.5,
        height=64,
        width=64,
        eta=0.7,
        samples_per_prompt=spp,
        max_sequence_length=32,
    )
    n = len(PROMPTS) * spp
    sigmas = sigmas_from_scheduler_config(scheduler_config, steps, image_seq_len=16)
    sample_ids = torch.arange(100, 100 + n)
    return RolloutReq(
        sample_ids=sample_ids,
        group_ids=torch.arange(len(PROMPTS)).repeat_interleave(spp),
        primitives={"text": Texts(texts=[p for p in PROMPTS for _ in range(spp)])},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=sample_ids.clone(),
                sde_indices=torch.tensor([[0, 2, 4]] * n),
                sigmas=sigmas,
                init_noise_shape=tuple(latent_shape),
            )
        },
        sampling_params=sampling,
        seed=7,
        rollout_index=3,
    )


def stage(req: RolloutReq) -> DiffusionRequest:
    """The request's diffusion block (σ schedule, SDE steps, x_T recipe)."""
    return req.params_for("diffusion", DiffusionRequest)


def trainside_stack(seed: int = 0) -> tuple[Any, Any, Any]:
    """``(bundle, backend, pipeline)``: an FSDPBackend with a LoRA whose B is non-zero, so an
    engine that misses the adapter samples visibly different trajectories."""
    from unirl.models.sd3 import SD3Bundle, SD3Pipeline
    from unirl.train import FSDPBackend

    bundle = SD3Bundle(**{k: v for k, v in BUNDLE_BLOCK.items() if k != "_target_"})
    backend = FSDPBackend(
        bundle=bundle, lora=dict(LORA), param_dtype="fp32", device="cpu", seed=seed
    )
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in backend.named_trainable_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    pipeline = SD3Pipeline(bundle=bundle, strategy=FlowSDE(eta=0.7), storage_dtype="fp32")
    return bundle, backend, pipeline


def sync_in_process(sync: Any, backend: Any, engine: Any) -> dict[str, Any]:
    """One colocated (``local``) sync without Ray: manifest -> prepare -> push -> verify."""
    from unirl.distributed.weight_sync import SyncSource, compare_checksums

    source = SyncSource(backend=backend, sync=sync, engine=engine)
    raw = source.manifest()
    dtypes = engine.prepare_sync(raw)
    manifest = raw.with_receiver_dtypes(dtypes, sync.wire_dtype)
    engine.prepare_sync(manifest)
    report = source.push_local(manifest)
    compare_checksums(report["expected"], report["checksums"], where="test sync")
    return report
