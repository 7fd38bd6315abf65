"""VAE decode variants at the SD3.5-Medium shapes (16 latents of 16x64x64 -> 512x512 images):
precision, memory format, cuDNN autotuning, chunk size and ``torch.compile``. Needs CUDA.

    python examples/benchmarks/vae_decode_bench.py [OUT.json]
"""

from __future__ import annotations

import json
import sys
import time

import torch

from unirl.models.sd3.arch import sd35_medium_arch_spec


def timed(fn, iters: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def main() -> None:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKL(**sd35_medium_arch_spec().vae).eval().requires_grad_(False)
    latents = torch.randn(16, 16, 64, 64, device="cuda")

    def decode(model, dtype: torch.dtype, chunk: int, channels_last: bool = False):
        def run() -> None:
            with torch.no_grad():
                for i in range(0, latents.shape[0], chunk):
                    z = latents[i : i + chunk].to(dtype)
                    if channels_last:
                        z = z.contiguous(memory_format=torch.channels_last)
                    model.decode(z, return_dict=False)

        return run

    results: dict[str, float] = {}
    vae_fp32 = vae
    results["fp32_chunk8"] = timed(decode(vae_fp32, torch.float32, 8))
    vae_bf16 = vae.to(torch.bfloat16)
    results["bf16_chunk8"] = timed(decode(vae_bf16, torch.bfloat16, 8))
    results["bf16_chunk16"] = timed(decode(vae_bf16, torch.bfloat16, 16))
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False):
        results["bf16_chunk8_cudnn_benchmark"] = timed(decode(vae_bf16, torch.bfloat16, 8))
    vae_bf16.to(memory_format=torch.channels_last)
    results["bf16_chunk8_channels_last"] = timed(decode(vae_bf16, torch.bfloat16, 8, True))
    vae_bf16.to(memory_format=torch.contiguous_format)
    vae_bf16.decoder.compile(dynamic=False)
    t0 = time.perf_counter()
    decode(vae_bf16, torch.bfloat16, 8)()
    torch.cuda.synchronize()
    results["compile_s"] = time.perf_counter() - t0
    results["bf16_chunk8_compiled"] = timed(decode(vae_bf16, torch.bfloat16, 8))
    text = json.dumps(
        {"device": torch.cuda.get_device_name(), "seconds_per_16_images": results}, indent=2
    )
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
