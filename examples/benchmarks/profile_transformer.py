"""Where a training step's transformer time goes, at the Flow-GRPO shape on one GPU: the
SD3.5-Medium-shaped MMDiT (random weights) with LoRA r32 through ``FSDPBackend`` (regional
compile), 16 rows (8 prompts x CFG) at 512x512 with 205 text tokens. Times a no-grad
forward (rollout / reference) and a LoRA forward + backward, then prints the top CUDA
kernels of one of each from ``torch.profiler``.

    python examples/benchmarks/profile_transformer.py [--sdpa auto|flash|cudnn]
        [--json OUT.json] [--rows 25] [--path tiny --device cpu --no-compile] [--no-fuse]
        [--batch 16] [--inductor combo_kernels=True] [--skip-profile]

``--no-fuse`` runs diffusers' attention processor (three q / k / v matmuls and peft's separate
LoRA matmuls) instead of the fused projections (``bundle.fuse_projections``).
``--batch`` sets the rows per forward (16: the rollout's CFG batch; 8: Flow-GRPO's training
forward over the conditional rows). ``--inductor KEY=VALUE`` (repeatable) is one entry of
``backend.fsdp.inductor_options`` (``torch._inductor.config`` before the blocks compile). ``--skip-profile`` stops after
the timings.
"""

from __future__ import annotations

import argparse
import ast
import json
import time

import torch

from unirl.models.sd3 import SD3Bundle
from unirl.models.sd3.conditions import SD3Conditions
from unirl.train import FSDPBackend, LoraConfig


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters: int = 5) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sdpa", default="auto")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--path", default="sd3.5-medium-arch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-fuse", action="store_true")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--inductor", action="append", default=[])
    parser.add_argument("--skip-profile", action="store_true")
    args = parser.parse_args()
    inductor = {}
    for item in args.inductor:
        key, _, value = item.partition("=")
        inductor[key] = ast.literal_eval(value)

    bundle = SD3Bundle(
        path=args.path,
        dtype="bf16",
        device=args.device,
        skip_t5=True,
        max_sequence_length=128,
        sdpa_backend=args.sdpa,
        fuse_projections=not args.no_fuse,
    )
    fsdp = {"compile": not args.no_compile, "inductor_options": inductor or None}
    backend = FSDPBackend(
        bundle=bundle, lora=LoraConfig(rank=32, alpha=64), fsdp=fsdp, device=args.device
    )
    dev = bundle.device
    gen = torch.Generator(device=dev).manual_seed(0)
    n, side = (args.batch, 64) if dev.type == "cuda" else (2, 8)
    tcfg = backend.module.config
    cond = SD3Conditions(
        prompt_embeds=torch.randn(n, 77 + 128, tcfg.joint_attention_dim, device=dev, generator=gen),
        pooled_prompt_embeds=torch.randn(n, tcfg.pooled_projection_dim, device=dev, generator=gen),
    )
    x = torch.randn(n, tcfg.in_channels, side, side, device=dev, generator=gen)
    sigma = torch.full((n,), 0.6, device=dev)

    def forward() -> None:
        with torch.no_grad():
            bundle.predict_velocity(x, sigma, cond)

    def reference() -> None:
        with torch.no_grad(), backend.adapter_disabled():
            bundle.predict_velocity(x, sigma, cond)

    def fwd_bwd() -> None:
        bundle.predict_velocity(x, sigma, cond).square().mean().backward()

    t0 = time.perf_counter()
    for fn in (forward, reference, fwd_bwd):
        fn()
    sync()
    compile_s = time.perf_counter() - t0
    result = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "sdpa": args.sdpa,
        "fuse_projections": not args.no_fuse,
        "batch": n,
        "inductor": inductor,
        "compile_s": compile_s,
        "forward_s": timed(forward),
        "reference_s": timed(reference),
        "fwd_bwd_s": timed(fwd_bwd),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0,
    }
    print(json.dumps(result, indent=2), flush=True)
    if args.skip_profile:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return

    from torch.profiler import ProfilerActivity, profile

    activity, key = (
        (ProfilerActivity.CUDA, "self_cuda_time_total")
        if dev.type == "cuda"
        else (ProfilerActivity.CPU, "self_cpu_time_total")
    )
    for name, fn in (("forward", forward), ("fwd_bwd", fwd_bwd)):
        with profile(activities=[activity]) as prof:
            fn()
            sync()
        table = prof.key_averages().table(
            sort_by=key, row_limit=args.rows, max_name_column_width=110
        )
        print(f"== {name} ==\n{table}", flush=True)
        result[f"{name}_table"] = table
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
