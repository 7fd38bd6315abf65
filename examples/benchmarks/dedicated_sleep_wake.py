"""Colocated dedicated engine on one GPU: how much device memory ``sleep()`` frees, whether
``wake_up()`` restores it, and whether outputs after waking equal outputs before.

    PRETRAINED_MODEL=sd3.5-medium-arch python examples/benchmarks/dedicated_sleep_wake.py

Prints one JSON line (recorded in docs/performance.md).
"""

from __future__ import annotations

import json
import os

import torch

from unirl.models.sd3 import SD3Bundle
from unirl.rollout import DedicatedEngine
from unirl.sde import RandomSubsetSchedule, sigmas_from_scheduler_config
from unirl.types import DiffusionRequest, DiffusionSamplingParams, RolloutReq, Texts


def main() -> None:
    path = os.environ.get("PRETRAINED_MODEL", "sd3.5-medium-arch")
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"  # CPU: a functional check only, memory reads 0

    def allocated() -> int:
        return torch.cuda.memory_allocated() if cuda else 0

    size = int(os.environ.get("SIZE", "512"))
    bundle_cfg = {
        "_target_": "unirl.models.sd3.SD3Bundle",
        "path": path,
        "dtype": "bf16",
        "device": "cuda",
        "max_sequence_length": 128,
    }
    pipeline_cfg = {
        "_target_": "unirl.models.sd3.SD3Pipeline",
        "strategy": {"_target_": "unirl.sde.FlowSDE", "eta": 0.7},
        "storage_dtype": "bf16",
    }
    base = allocated()
    engine = DedicatedEngine(
        bundle=bundle_cfg, pipeline=pipeline_cfg, dtype="bf16" if cuda else "fp32", device=device
    )
    bundle: SD3Bundle = engine.bundle
    held = allocated() - base
    n = 4
    params = DiffusionSamplingParams(
        num_inference_steps=4,
        guidance_scale=4.5,
        height=size,
        width=size,
        samples_per_prompt=n,
        max_sequence_length=128,
    )
    sigmas = sigmas_from_scheduler_config(
        bundle.scheduler_config, 4, image_seq_len=bundle.image_seq_len(size, size)
    )
    steps = RandomSubsetSchedule(num_steps=3, fraction=(0.0, 0.99)).select(4, seed=0)
    req = RolloutReq(
        sample_ids=torch.arange(n),
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=['a sign that says "OPEN"'] * n)},
        stage_params={
            "diffusion": DiffusionRequest(
                init_noise_ids=torch.arange(n),
                sde_indices=torch.tensor([list(steps)] * n),
                sigmas=sigmas,
                init_noise_shape=bundle.latent_shape(size, size),
            )
        },
        sampling_params=params,
        seed=3,
    )
    before = engine.generate(req).tracks["diffusion"]
    allocated_awake = allocated() - base
    slept = engine.sleep()
    allocated_asleep = allocated() - base
    woke = engine.wake_up()
    allocated_woken = allocated() - base
    after = engine.generate(req).tracks["diffusion"]
    same = torch.equal(before.segment.sde_logp, after.segment.sde_logp) and torch.equal(
        before.decoded.pixels, after.decoded.pixels
    )
    out = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "engine_bytes_gib": slept["engine_bytes"] / 2**30,
        "held_after_build_gib": held / 2**30,
        "allocated_awake_gib": allocated_awake / 2**30,
        "allocated_asleep_gib": allocated_asleep / 2**30,
        "freed_fraction_of_engine": (allocated_awake - allocated_asleep)
        / max(slept["engine_bytes"], 1),
        "allocated_after_wake_gib": allocated_woken / 2**30,
        "restored_bytes_gib": woke["restored_bytes"] / 2**30,
        "outputs_equal_after_wake": bool(same),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
