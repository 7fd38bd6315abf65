"""Generation throughput of the AR samplers on one GPU: the reference loop
(``sampler: loop``) against the decode engine (fused / merged LoRA, with and without CUDA
graphs), with the fraction of the card's memory-bandwidth limit each reaches.

    python examples/benchmarks/ar_engine_bench.py --json OUT.json            # Qwen3-4B shape
    python examples/benchmarks/ar_engine_bench.py --stop-fraction 0.01       # uneven lengths
    python examples/benchmarks/ar_engine_bench.py --family qwen-vl --preset qwen2.5-vl-3b-arch \
        --image-size 448 --prompts 8 --spp 8 --new-tokens 256                # vision-language
    python examples/benchmarks/ar_engine_bench.py --preset tiny --device cpu --modes loop,eager

Shapes: ``--prompts`` distinct prompts of exactly ``--prompt-tokens`` random token ids, each
sampled ``--spp`` times, ``--new-tokens`` per completion, a random-init ``*-arch`` preset in
bf16 with LoRA (rank ``--lora-rank`` on q k v o gate up down, B drawn non-zero so the
adapter changes the function). ``--stop-fraction p`` makes the first ``p·V`` token ids stop
tokens: lengths then follow the model's own draws (roughly geometric, a long tail up to the
cap), the shape where continuous batching matters; otherwise no stop token (every completion
runs to the cap). The same uniforms feed every mode.

The limit: one decode step must read every weight once plus the K/V of every sequence;
``limit tokens/s = batch / (bytes per step / bandwidth)`` with the K/V at the mean context of
the run, at the card's nominal bandwidth (H200 4.8 TB/s, H100 SXM 3.35 TB/s).
Checks: the graph-replayed engine emits exactly the eager engine's tokens (same kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from unirl.models.common_ar.engine import DecodeEngine, DecodeEngineConfig
from unirl.models.common_ar.generate import generate_completions

BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(args: argparse.Namespace):
    from unirl.train.lora import LoraConfig, inject_lora

    dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    if args.family == "qwen3":
        from unirl.models.qwen3 import Qwen3Bundle

        bundle = Qwen3Bundle(path=args.preset, dtype=dtype, device=args.device)
    else:
        from unirl.models.qwen_vl import QwenVLBundle

        bundle = QwenVLBundle(
            path=args.preset, dtype=dtype, device=args.device, image_size=args.image_size
        )
    if args.lora_rank:
        inject_lora(
            bundle.model, LoraConfig(rank=args.lora_rank, alpha=2 * args.lora_rank), TARGETS, seed=0
        )
        with torch.no_grad():
            for name, p in bundle.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 1e-3)
    return bundle


def vocab_size(bundle) -> int:
    lm = bundle.model
    return int(lm.get_output_embeddings().weight.shape[0])


def step_bytes(bundle, batch: int, context: float) -> float:
    weights = sum(p.numel() * p.element_size() for p in bundle.model.parameters())
    cfg = bundle.model.config
    text = getattr(cfg, "text_config", cfg)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * 2  # K and V, bf16
    return weights + batch * context * kv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["qwen3", "qwen-vl"], default="qwen3")
    ap.add_argument("--preset", default="qwen3-4b-arch")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--spp", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--lora-rank", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--stop-fraction", type=float, default=0.0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--modes", default="loop,eager,fused,merged")
    ap.add_argument("--max-slots", type=int, default=None)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    bundle = build(args)
    n = args.prompts * args.spp
    vocab = vocab_size(bundle)
    gen = torch.Generator().manual_seed(0)
    # ids from the tiny tokenizer's range (arch presets borrow it), as the bundle would give
    top = min(vocab, 380)
    distinct = [
        torch.randint(3, top, (args.prompt_tokens,), generator=gen).tolist()
        for _ in range(args.prompts)
    ]
    prompts = [p for p in distinct for _ in range(args.spp)]
    u = torch.rand(n, args.new_tokens, dtype=torch.float64, generator=gen)
    stops = list(range(1, 1 + int(args.stop_fraction * vocab))) if args.stop_fraction else []
    knobs = {
        "max_new_tokens": args.new_tokens,
        "temperature": args.temperature,
        "stop_token_ids": stops,
        "pad_token_id": 0,
        "suppress_token_ids": bundle.prompts.suppressed_token_ids,
    }
    inputs = {}
    if args.family == "qwen-vl":
        inputs = vl_inputs(bundle, prompts, args)
        prompts = inputs.pop("prompts")
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bandwidth = next((v for k, v in BANDWIDTH.items() if k in name), None)
    rows, tokens_of = {}, {}
    for mode in args.modes.split(","):
        engine = None
        if mode != "loop":
            engine = DecodeEngine(
                DecodeEngineConfig(
                    max_slots=args.max_slots,
                    lora="merged" if mode == "merged" else "fused",
                    cuda_graphs=mode != "eager",
                )
            )
        times, lengths = [], []
        for it in range(1 + args.iters):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with bundle.sampling_mode():
                if engine is None:
                    out = loop(bundle, prompts, u, knobs, inputs)
                else:
                    out = engine.generate(
                        bundle.model, prompts, u, **knobs, **inputs.get("engine", {})
                    )
            if device.type == "cuda":
                torch.cuda.synchronize()
            if it > 0:
                times.append(time.perf_counter() - t0)
                lengths.append(sum(len(c.tokens) for c in out))
        tokens_of[mode] = [c.tokens for c in out]
        seconds = sum(times) / len(times)
        generated = sum(lengths) / len(lengths)
        mean_len = generated / n
        row = {
            "seconds": round(seconds, 4),
            "generated_tokens": generated,
            "mean_completion_tokens": round(mean_len, 1),
            "max_completion_tokens": max(len(t) for t in tokens_of[mode]),
            "generated_tokens_per_s": round(generated / seconds, 1),
        }
        if bandwidth:
            context = args.prompt_tokens + mean_len / 2
            limit = (
                n
                / (step_bytes(bundle, n, context) / bandwidth)
                * (mean_len / args.new_tokens if stops else 1.0)
            )
            row["limit_tokens_per_s"] = round(limit, 1)
            row["fraction_of_limit"] = round(generated / seconds / limit, 3)
        if engine is not None:
            row.update({k: round(v, 4) for k, v in engine.stats.as_metrics().items()})
        if device.type == "cuda":
            row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        rows[mode] = row
        print(mode, json.dumps(row), flush=True)
    summary = {"device": name, "shape": vars(args), "rows": rows}
    if "eager" in tokens_of and "fused" in tokens_of:
        summary["graphs_equal_eager_tokens"] = tokens_of["eager"] == tokens_of["fused"]
    if "loop" in rows:
        summary["speedup_over_loop"] = {
            m: round(r["generated_tokens_per_s"] / rows["loop"]["generated_tokens_per_s"], 2)
            for m, r in rows.items()
        }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


def loop(bundle, prompts, u, knobs, inputs):
    if not inputs:
        return generate_completions(bundle.model, prompts, u, **knobs)
    return generate_completions(bundle.model, prompts, u, **knobs, **inputs["loop"])


def vl_inputs(bundle, prompts, args):
    """One image per distinct prompt (its samples share it): the image placeholders spliced
    into the prompt as the bundle's formatter does, the vision inputs of the prefill."""
    from unirl.models.common_ar.engine import hf_prefill
    from unirl.models.qwen_vl.vision import padded_mrope_positions, patchify

    gen = torch.Generator().manual_seed(1)
    distinct = prompts[:: args.spp]
    images = [torch.rand(3, args.image_size, args.image_size, generator=gen) for _ in distinct]
    patches = [patchify(img) for img in images]
    texts = ["x" * (args.prompt_tokens // 2)] * len(distinct)
    encoded = bundle.encode_prompts(texts)  # holds the image placeholders
    rows = [e for e in encoded for _ in range(args.spp)]
    owner = [i // args.spp for i in range(len(rows))]
    token = bundle.prompts.image_token_id

    def pixels(idx):
        return {
            "pixel_values": torch.cat([patches[owner[i]][0] for i in idx]).to(bundle.dtype),
            "image_grid_thw": torch.stack([patches[owner[i]][1] for i in idx]),
        }

    def positions(idx, ids, mask):
        return padded_mrope_positions(
            ids, mask, token, torch.stack([patches[owner[i]][1] for i in idx])
        )

    everything = list(range(len(rows)))
    return {
        "prompts": rows,
        "loop": {
            "prefill_inputs": pixels(everything),
            "positions_fn": lambda ids, mask: positions(everything, ids, mask),
        },
        "engine": {
            "prefix_keys": owner,
            "prefill": hf_prefill(
                bundle.model, rows, pad_token_id=0, extra_inputs=pixels, positions_fn=positions
            ),
        },
    }


if __name__ == "__main__":
    main()
