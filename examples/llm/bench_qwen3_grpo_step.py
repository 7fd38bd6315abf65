"""One GRPO step of a Qwen3 (or Qwen2.5-VL) family at a preset's shapes on one GPU, without
Ray: the trainside sampler (KV cache, per-sample seeds) then one optimizer step on
token-budget micro-batches. Prints generated tokens/s, trained tokens/s, peak memory and the
rollout-vs-replay log-prob gap as one JSON line.

    python examples/llm/bench_qwen3_grpo_step.py --path qwen3-4b-arch --prompts 16 \\
        --samples 8 --max-new-tokens 512 --lora-rank 32
    python examples/llm/bench_qwen3_grpo_step.py --family qwen_vl --path qwen2.5-vl-3b-arch
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from unirl.algorithms import GRPO
from unirl.train import FSDPBackend, LoraConfig, TrainStack
from unirl.types import Images, RolloutReq, TextRequest, Texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["qwen3", "qwen_vl"], default="qwen3")
    parser.add_argument("--path", default="qwen3-4b-arch")
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--lora-rank", type=int, default=32, help="0: full fine-tuning")
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--attn", default="sdpa")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    knobs = {
        "path": args.path,
        "dtype": args.dtype,
        "device": device,
        "attn_implementation": args.attn,
        "gradient_checkpointing": True,
    }
    if args.family == "qwen_vl":
        from unirl.models.qwen_vl import QwenVLBundle as Bundle
        from unirl.models.qwen_vl import QwenVLPipeline as Pipeline

        knobs["image_size"] = args.image_size
    else:
        from unirl.models.qwen3 import Qwen3Bundle as Bundle  # type: ignore[assignment]
        from unirl.models.qwen3 import Qwen3Pipeline as Pipeline  # type: ignore[assignment]
    bundle = Bundle(**knobs)
    lora = LoraConfig(rank=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
    backend = FSDPBackend(
        bundle=bundle,
        lora=lora,
        optimizer={"lr": 1e-6},
        param_dtype=args.dtype,
        device=device,
        trainable_attr="model",
    )
    pipe = Pipeline(bundle=bundle)
    algo = GRPO(policy=pipe, clip_low=0.2, clip_high=0.28)
    stack = TrainStack(
        backend=backend, algorithm=algo, max_tokens_per_micro_batch=args.token_budget
    )
    t_build = time.perf_counter() - t0

    n = args.prompts * args.samples
    ids = torch.arange(n)
    prompts = [
        f"What is {i} + {i + 3}? Put the final answer in \\boxed{{}}." for i in range(args.prompts)
    ]
    primitives = {"text": Texts(texts=[p for p in prompts for _ in range(args.samples)])}
    if args.family == "qwen_vl":
        size = args.image_size
        pixels = torch.rand(args.prompts, 3, size, size, generator=torch.Generator().manual_seed(0))
        primitives["image"] = Images(pixels=pixels.repeat_interleave(args.samples, dim=0))
    req = RolloutReq(
        sample_ids=ids,
        group_ids=torch.arange(args.prompts).repeat_interleave(args.samples),
        primitives=primitives,
        stage_params={
            "text": TextRequest(seed_ids=ids, max_new_tokens=args.max_new_tokens, temperature=1.0)
        },
        seed=0,
    )
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    track = pipe.generate(req).tracks["text"]
    if device == "cuda":
        torch.cuda.synchronize()
    t_generate = time.perf_counter() - t0
    generated = int(track.segment.loss_mask.values.sum())
    total_tokens = int(track.segment.tokens.values.numel())
    track = dataclasses.replace(
        track, advantages=torch.randn(n, generator=torch.Generator().manual_seed(0))
    )
    algo.start_rollout(0)
    t0 = time.perf_counter()
    out = stack.train_track(track, 0)
    if device == "cuda":
        torch.cuda.synchronize()
    t_train = time.perf_counter() - t0
    gap = algo.after_train(0)
    step = out["steps"][0]
    print(
        json.dumps(
            {
                "path": args.path,
                "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                "lora_rank": args.lora_rank,
                "sequences": n,
                "max_new_tokens": args.max_new_tokens,
                "generated_tokens": generated,
                "trained_tokens": total_tokens,
                "build_s": round(t_build, 2),
                "generate_s": round(t_generate, 2),
                "train_s": round(t_train, 2),
                "generated_tokens_per_s": round(generated / t_generate, 1),
                "trained_tokens_per_s": round(total_tokens / t_train, 1),
                "micro_batches": step["micro_batches"],
                "loss": step["loss"],
                "grad_norm": step["grad_norm"],
                "ratio_min": step["ratio/min"],
                "ratio_max": step["ratio/max"],
                "logp_gap": gap.get("rollout/logp_gap"),
                "logp_gap_max": gap.get("rollout/logp_gap_max"),
                "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if device == "cuda"
                else 0.0,
                "trainable_params": backend.num_trainable_params(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
