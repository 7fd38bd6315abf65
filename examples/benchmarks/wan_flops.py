"""FLOPs of one Wan transformer pass at the released shapes, counted on meta tensors.

The bench's FLOP pass (``unirl.tools.bench``, ``FLOPS=1``) runs a whole extra rollout and
training step on the GPU; for an 81-frame video that is minutes of device time. The model
FLOPs of one transformer pass depend only on the shapes, so this counts them with the same
``FlopCounterMode`` and attention formulas on ``meta`` tensors, on any machine, in seconds:

    python examples/benchmarks/wan_flops.py --arch wan2.1-1.3b-arch --frames 81 --height 480 --width 832

It prints, per video row (one sample of one CFG branch), the forward's TFLOP and the
backward's when the frozen base passes gradients to its input (LoRA training: the adapters'
own weight gradients are left out, < 1% at rank 32), and the attention share of each. On
meta tensors attention runs as two matmuls, so the backward counts the gradients autograd
needs: the cross-attention's text keys and values get none (a fused GPU kernel computes them
anyway: at 512 text tokens against 32,760 video tokens that is 0.6% of the backward). A
step's MFU is then ``(rollout rows x forward + trained rows x (forward + backward)) / (step
seconds x peak)``; ``docs/performance.md`` (seventeenth session) applies it to Wan's GPU runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import torch

from unirl.models.common.geometry import VideoGrid

ATTENTION_OPS = ("bmm", "scaled_dot_product")  # meta SDPA runs the math path: two bmm per call


def grid(
    transformer: Mapping[str, Any] | None = None, vae: Mapping[str, Any] | None = None
) -> VideoGrid:
    """The Wan family's token grid (``WanBundle.video_grid``) of these configs (default: the
    Wan 2.1 VAE and the family's patches)."""
    from unirl.models.wan.arch import WAN21_VAE
    from unirl.models.wan.bundle import WanBundle

    return WanBundle.video_grid((dict(transformer or {}), dict(vae or WAN21_VAE)))


def latent_shape(frames: int, height: int, width: int, channels: int = 16) -> tuple[int, ...]:
    """``[1, C, T, H, W]`` latents of a ``frames x height x width`` video: the Wan VAE keeps the
    first frame and folds every 4 after it (``frames = 4k + 1``), and downsamples 8x in space."""
    g = grid()
    side = g.spatial * g.patch
    if (frames - 1) % g.temporal or height % side or width % side:
        raise SystemExit(
            f"--frames must be {g.temporal}k + 1 and --height / --width multiples of {side} (the "
            f"VAE's {g.spatial}x and the transformer's {g.patch}x{g.patch} patches); got "
            f"{frames} x {height} x {width}"
        )
    return (1, channels, (frames - 1) // g.temporal + 1, height // g.spatial, width // g.spatial)


def _attention_share(counts: Mapping[str, Mapping[Any, int]]) -> float:
    ops = counts.get("Global", {})
    total = sum(ops.values())
    attention = sum(n for op, n in ops.items() if any(a in str(op) for a in ATTENTION_OPS))
    return attention / total if total else 0.0


def count_pass(
    transformer: torch.nn.Module,
    latents: torch.Tensor,
    text: torch.Tensor,
    *,
    backward: bool,
) -> dict[str, float]:
    """FLOPs of one forward (and, with ``backward``, the gradient to ``latents`` through the
    frozen weights) of ``transformer`` on ``latents`` / ``text``, as ``{"forward": ...,
    "backward": ..., "attention_share_forward": ...}``."""
    from torch.utils.flop_counter import FlopCounterMode

    from unirl.trainer.roles import attention_flop_formulas

    transformer.requires_grad_(False)
    timestep = torch.zeros(latents.shape[0], dtype=torch.long, device=latents.device)
    formulas = attention_flop_formulas()
    latents = latents.detach().requires_grad_(backward)
    counter = FlopCounterMode(display=False, custom_mapping=formulas)
    with counter as forward_counter, torch.set_grad_enabled(backward):
        (out,) = transformer(
            hidden_states=latents,
            timestep=timestep,
            encoder_hidden_states=text,
            return_dict=False,
        )
    result = {
        "forward": float(forward_counter.get_total_flops()),
        "attention_share_forward": _attention_share(forward_counter.get_flop_counts()),
    }
    if backward:
        with FlopCounterMode(display=False, custom_mapping=formulas) as backward_counter:
            out.backward(torch.ones_like(out))
        result["backward"] = float(backward_counter.get_total_flops())
        result["attention_share_backward"] = _attention_share(backward_counter.get_flop_counts())
    return result


def meta_transformer(config: Mapping[str, Any]) -> torch.nn.Module:
    """Diffusers' ``WanTransformer3DModel`` from ``config`` with meta weights (no memory)."""
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        return WanTransformer3DModel.from_config(dict(config)).to(torch.bfloat16)


def main(argv: list[str] | None = None) -> dict[str, float]:
    from unirl.models.wan.arch import ARCH_SPECS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(ARCH_SPECS), default="wan2.1-1.3b-arch")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--text-tokens", type=int, default=512, help="UMT5 length (Wan: 512)")
    opts = parser.parse_args(argv)
    spec = ARCH_SPECS[opts.arch]()
    config = spec.transformer
    transformer = meta_transformer(config)
    shape = latent_shape(opts.frames, opts.height, opts.width, config["in_channels"])
    latents = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    text = torch.empty(1, opts.text_tokens, config["text_dim"], device="meta", dtype=torch.bfloat16)
    counts = count_pass(transformer, latents, text, backward=True)
    tokens = grid(config, spec.vae).tokens(opts.height, opts.width, opts.frames)
    report = {
        "arch": opts.arch,
        "tokens": tokens,
        "forward_tflop": counts["forward"] / 1e12,
        "backward_tflop": counts["backward"] / 1e12,
        "attention_share_forward": counts["attention_share_forward"],
        "attention_share_backward": counts["attention_share_backward"],
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
