"""One think-then-draw GRPO step of Janus-Pro at a preset's shapes on one GPU, without Ray: the
plan (KV-cached sampler), the image tokens with classifier-free guidance, the VQ decode, then
one joint optimizer step (plan GRPO + image-token GRPO, ``UnifiedTrainStack``). Advantages
come from the images' brightness (a stand-in reward: the step's cost does not depend on it).
Prints one JSON line: times per phase, tokens/s, peak memory, first ratios, the rollout-vs-
replay log-prob gap.

    python examples/unified_model/bench_janus_step.py --path janus-pro-7b-arch --prompts 8 \\
        --samples 4 --plan-tokens 128 --lora-rank 64
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from unirl.algorithms import GRPO
from unirl.models.janus import (
    ImageTokenRequest,
    JanusBundle,
    JanusImagePipeline,
    JanusPipeline,
    JanusTextPipeline,
)
from unirl.train import FSDPBackend, LoraConfig
from unirl.train.unified_stack import UnifiedTrainStack
from unirl.types import RolloutReq, TextRequest, Texts

PROMPTS = [
    "a photo of a red bicycle leaning on a blue wall",
    "two cats sleeping on a wooden bench in the sun",
    "a bowl of ramen with an egg, top view",
    "a lighthouse on a cliff at sunset, oil painting",
    "a green apple next to a glass of milk",
    "an astronaut riding a horse on the moon",
    "three yellow tulips in a white vase",
    "a city street at night in the rain, neon signs",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="janus-pro-7b-arch")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--plan-tokens", type=int, default=128)
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--lora-rank", type=int, default=64, help="0: full fine-tuning")
    parser.add_argument("--image-micro-batch", type=int, default=4)
    parser.add_argument("--sampler", default="engine", choices=["engine", "loop"])
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, object] = {
        "path": args.path,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    t0 = time.perf_counter()
    bundle = JanusBundle(
        path=args.path,
        dtype="bf16",
        device=device,
        vq_dtype="bf16",
        gradient_checkpointing=args.gradient_checkpointing,
    )
    out["load_s"] = time.perf_counter() - t0
    text_pipe = JanusTextPipeline(bundle=bundle, sampler=args.sampler)
    image_pipe = JanusImagePipeline(bundle=bundle)
    lora = LoraConfig(rank=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
    backend = FSDPBackend(
        bundle=bundle,
        lora=lora,
        optimizer={"lr": 1e-6},
        param_dtype="bf16",
        device=device,
        trainable_attr="model",
    )
    stack = UnifiedTrainStack(
        backend=backend,
        text_algorithm=GRPO(policy=text_pipe, old_logp_source="replay"),
        image_algorithm=GRPO(policy=image_pipe, old_logp_source="replay"),
        text={"weight": 1.0, "max_tokens_per_micro_batch": 8192},
        image={"weight": 1.0, "micro_batch_size": args.image_micro_batch},
    )
    out["trainable_params"] = backend.num_trainable_params()
    out["setup_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0

    n = args.prompts * args.samples
    ids = torch.arange(n)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts) for _ in range(args.samples)]
    req = RolloutReq(
        sample_ids=ids,
        group_ids=ids // args.samples,
        primitives={"text": Texts(texts=prompts)},
        stage_params={
            "text": TextRequest(seed_ids=ids, max_new_tokens=args.plan_tokens, temperature=1.0),
            "image": ImageTokenRequest(
                seed_ids=ids, max_new_tokens=1, temperature=1.0, guidance_scale=args.guidance
            ),
        },
        seed=0,
    )
    sampler = JanusPipeline(text_pipeline=text_pipe, image_pipeline=image_pipe)
    for phase in ("warmup", "timed"):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        resp = sampler.generate(req)
        if device == "cuda":
            torch.cuda.synchronize()
        rollout_s = time.perf_counter() - t0
        text, image = resp.tracks["text"], resp.tracks["image"]
        bright = image.decoded.pixels.mean(dim=(1, 2, 3)).view(args.prompts, args.samples)
        adv = ((bright - bright.mean(1, keepdim=True)) / (bright.std(1, keepdim=True) + 1e-6)).view(
            -1
        )
        rollout_peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = stack._train_tracks(
            dataclasses.replace(text, advantages=adv, decoded=None),
            dataclasses.replace(image, advantages=adv, decoded=None),
            0 if phase == "warmup" else 1,
        )
        if device == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        step = result["steps"][0]
        plan_tokens = int(text.segment.loss_mask.values.sum())
        image_tokens = int(image.segment.loss_mask.values.sum())
        out[phase] = {
            "rollout_s": rollout_s,
            "text_generate_s": resp.timings.get("text/generate"),
            "train_step_s": train_s,
            "plan_tokens": plan_tokens,
            "image_tokens": image_tokens,
            "image_tokens_per_s_rollout": image_tokens / rollout_s,
            "trained_tokens_per_s": (plan_tokens + image_tokens) / train_s,
            "rollout_peak_gib": rollout_peak,
            "train_peak_gib": torch.cuda.max_memory_allocated() / 2**30
            if device == "cuda"
            else 0.0,
            "text_ratio": [step.get("text/ratio/min"), step.get("text/ratio/max")],
            "image_ratio": [step.get("image/ratio/min"), step.get("image/ratio/max")],
            "old_logp_gap_max": step.get("old_logp/rollout_vs_replay_max"),
            "loss": step.get("loss"),
            "grad_norm": step.get("grad_norm"),
        }
        print(json.dumps({phase: out[phase]}), flush=True)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
