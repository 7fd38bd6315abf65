"""Kernel-level roofline at the SD3.5-Medium shapes (512x512, 8 prompts x CFG = 16 rows):
the bf16 projection and feed-forward matmuls, and the SDPA backends (flash, cuDNN,
memory-efficient) for the joint attention, forward and forward + backward. Needs a CUDA card;
writes JSON.

    python examples/benchmarks/kernels_microbench.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

ROWS_IMAGE = 16 * 1024  # 16 rows x 1024 image tokens
ROWS_JOINT = 16 * (1024 + 205)  # + 77 CLIP + 128 T5 tokens
HIDDEN, FF = 1536, 6144


def bench_ms(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def linear_rows() -> list[dict]:
    out = []
    for name, m, k, n in [
        ("image qkv/out projection", ROWS_IMAGE, HIDDEN, HIDDEN),
        ("image ff up", ROWS_IMAGE, HIDDEN, FF),
        ("image ff down", ROWS_IMAGE, FF, HIDDEN),
        ("context projection", ROWS_JOINT - ROWS_IMAGE, HIDDEN, HIDDEN),
    ]:
        torch.manual_seed(0)
        dense = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        flop = 2 * m * k * n
        ms = bench_ms(lambda dense=dense, x=x: dense(x))
        xg = x.clone().requires_grad_(True)
        ms_fb = bench_ms(lambda dense=dense, xg=xg: dense(xg).sum().backward())
        out.append(
            {
                "name": name,
                "m": m,
                "k": k,
                "n": n,
                "bf16_ms": round(ms, 4),
                "bf16_tflops": round(flop / ms / 1e9, 1),
                "bf16_fwd_input_grad_ms": round(ms_fb, 4),
            }
        )
    return out


def attention_rows() -> list[dict]:
    out = []
    heads, dim = 24, 64
    for seq in (1024 + 205, 1024):
        q, k, v = (
            torch.randn(
                16, heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True
            )
            for _ in range(3)
        )
        flop = 4 * 16 * heads * seq * seq * dim
        row = {"seq": seq}
        for label, backend in [
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ]:
            try:
                with sdpa_kernel(backend):
                    ms = bench_ms(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v))
                    ms_fb = bench_ms(
                        lambda q=q, k=k, v=v: (
                            F.scaled_dot_product_attention(q, k, v).sum().backward()
                        )
                    )
                row[f"{label}_fwd_ms"] = round(ms, 4)
                row[f"{label}_fwd_tflops"] = round(flop / ms / 1e9, 1)
                row[f"{label}_fwd_bwd_ms"] = round(ms_fb, 4)
                row[f"{label}_fwd_bwd_tflops"] = round(3.5 * flop / ms_fb / 1e9, 1)
            except RuntimeError as exc:
                row[f"{label}_error"] = str(exc).splitlines()[0][:200]
        out.append(row)
    return out


def main() -> None:
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "linear": linear_rows(),
        "attention": attention_rows(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
