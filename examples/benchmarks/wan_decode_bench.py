"""Wan VAE decode of whole videos through the bundle's own path: videos per decode call
(``bundle.decode_chunk_size``), the VAE's precision (``bundle.vae_dtype``) and
``bundle.compile_vae``, one configuration after another on one device.

Call 16's Wan 2.1 step spent 4.33 s of 59.88 decoding two 81-frame videos one per call in
fp32 (the recipe's ``decode_chunk_size: 1``, ``vae_dtype: fp32``); this measures what batching
the videos or a bf16 decoder would save, and how far their pixels move from the recipe's:

    python examples/benchmarks/wan_decode_bench.py --preset wan2.1-1.3b-arch --videos 2 \\
        --frames 81 --height 480 --width 832 --chunks 1 2 --dtypes fp32 bf16 --compile

Prints one JSON object: per configuration the seconds per decode of all videos (after one
untimed decode, which compiles), the peak memory, and the largest pixel difference from the
first configuration's output (pixels in [0, 1]).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_all(bundle: Any, latents: torch.Tensor, chunk: int) -> torch.Tensor:
    """``pixels`` of every video in ``latents``, ``chunk`` videos per VAE call (the bundle's
    ``decode`` loop with another chunk size)."""
    with torch.no_grad():
        parts = [bundle.decode_chunk(latents[i : i + chunk]) for i in range(0, len(latents), chunk)]
    return torch.cat(parts)


def run(opts: argparse.Namespace) -> dict[str, Any]:
    from unirl.models.wan import WanBundle

    device = torch.device(opts.device)
    results: dict[str, Any] = {"preset": opts.preset, "videos": opts.videos, "configs": []}
    reference: torch.Tensor | None = None
    latents: torch.Tensor | None = None
    for dtype in opts.dtypes:
        bundle = WanBundle(
            path=opts.preset,
            device=opts.device,
            vae_dtype=dtype,
            compile_vae=opts.compile,
            text_encoder_dtype="bf16",
        )  # builds (loads) the bundle
        if latents is None:
            shape = bundle.video_latent_shape(opts.frames, opts.height, opts.width)
            generator = torch.Generator().manual_seed(0)
            latents = torch.randn(opts.videos, *shape, generator=generator).to(device)
        for chunk in opts.chunks:
            pixels = decode_all(bundle, latents, chunk)  # untimed: compiles this chunk shape
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            start = time.perf_counter()
            for _ in range(opts.iters):
                pixels = decode_all(bundle, latents, chunk)
            _sync(device)
            seconds = (time.perf_counter() - start) / opts.iters
            pixels = pixels.float().cpu()
            if reference is None:
                reference = pixels
            entry = {
                "vae_dtype": dtype,
                "chunk": chunk,
                "compile": opts.compile,
                "seconds": seconds,
                "max_pixel_diff_from_first": float((pixels - reference).abs().max()),
            }
            if device.type == "cuda":
                entry["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            results["configs"].append(entry)
        del bundle
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="wan2.1-1.3b-arch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--videos", type=int, default=2)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--compile", action="store_true", help="bundle.compile_vae=true")
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the result here")
    opts = parser.parse_args(argv)
    results = run(opts)
    text = json.dumps(results, indent=2)
    print(text)
    if opts.json:
        with open(opts.json, "w") as f:
            f.write(text + "\n")
    return results


if __name__ == "__main__":
    main()
