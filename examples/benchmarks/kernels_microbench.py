"""Kernel-level roofline at the SD3.5-Medium shapes (512x512, 8 prompts x CFG = 16 rows):
bf16 vs FP8 (e4m3, rowwise scales, ``unirl.train.fp8``) matmuls, and the SDPA backends for
the joint attention, forward and forward + backward. Needs a CUDA card; writes JSON.

    python examples/benchmarks/kernels_microbench.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from unirl.train.fp8 import convert_frozen_linears

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
        ("qkv/out proj", ROWS_IMAGE, HIDDEN, HIDDEN),
        ("ff up", ROWS_IMAGE, HIDDEN, FF),
        ("ff down", ROWS_IMAGE, FF, HIDDEN),
    ]:
        torch.manual_seed(0)
        dense = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
        fp8 = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
        fp8.load_state_dict(dense.state_dict())
        convert_frozen_linears([nn.Sequential(fp8)])
        fp8_c = torch.compile(fp8)
        fp8t = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
        fp8t.load_state_dict(dense.state_dict())
        convert_frozen_linears([nn.Sequential(fp8t)], rowwise=False)
        fp8t_c = torch.compile(fp8t)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        flop = 2 * m * k * n
        row = {"name": name, "m": m, "k": k, "n": n}
        variants = [
            ("bf16", dense),
            ("fp8_eager", fp8),
            ("fp8_compiled", fp8_c),
            ("fp8_tensorwise_compiled", fp8t_c),
        ]
        for label, layer in variants:
            ms = bench_ms(lambda layer=layer, x=x: layer(x))
            row[f"{label}_ms"] = round(ms, 4)
            row[f"{label}_tflops"] = round(flop / ms / 1e9, 1)
        # forward + input-gradient backward (what a LoRA run's frozen base does in training)
        xg = x.clone().requires_grad_(True)
        for label, layer in [
            ("bf16", dense),
            ("fp8_compiled", fp8_c),
            ("fp8_tensorwise_compiled", fp8t_c),
        ]:

            def fwd_bwd(layer=layer, xg=xg) -> None:
                layer(xg).sum().backward()

            ms = bench_ms(fwd_bwd)
            row[f"{label}_fwd_bwd_ms"] = round(ms, 4)
        with torch.no_grad():
            ref = dense(x).float()
            row["fp8_rel_err"] = float((fp8(x).float() - ref).norm() / ref.norm())
            row["fp8_tensorwise_rel_err"] = float((fp8t(x).float() - ref).norm() / ref.norm())
        out.append(row)
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
