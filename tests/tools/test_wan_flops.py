"""``examples/benchmarks/wan_flops.py``: the FLOPs of a Wan transformer pass counted on meta
tensors equal the count on real tensors, and its attention term equals the closed form."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "benchmarks" / "wan_flops.py"

# a tiny Wan 2.1 transformer: 2 blocks, 2 heads x 24 (rope axes 8 / 8 / 8)
HEADS, HEAD_DIM, LAYERS, FFN, TEXT_DIM = 2, 24, 2, 96, 32
CONFIG = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": HEADS,
    "attention_head_dim": HEAD_DIM,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": TEXT_DIM,
    "freq_dim": 32,
    "ffn_dim": FFN,
    "num_layers": LAYERS,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 64,
}


@pytest.fixture(scope="module")
def wan_flops():
    spec = importlib.util.spec_from_file_location("wan_flops", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wan_flops"] = module
    spec.loader.exec_module(module)
    return module


def test_meta_count_equals_the_real_count_and_the_closed_form(wan_flops) -> None:
    from diffusers import WanTransformer3DModel

    shape = wan_flops.latent_shape(frames=9, height=64, width=96)  # [1, 16, 3, 8, 12]
    assert shape == (1, 16, 3, 8, 12)
    text_tokens = 7
    tokens = 3 * 4 * 6  # 2x2 patches

    meta = wan_flops.count_pass(
        wan_flops.meta_transformer(CONFIG).float(),
        torch.empty(shape, device="meta"),
        torch.empty(1, text_tokens, TEXT_DIM, device="meta"),
        backward=True,
    )
    torch.manual_seed(0)
    real_model = WanTransformer3DModel.from_config(CONFIG)
    real = wan_flops.count_pass(
        real_model, torch.randn(shape), torch.randn(1, text_tokens, TEXT_DIM), backward=True
    )
    # attention: QK^T and PV, 2 * s_q * s_k * d each per head, self (s x s) and cross (s x text)
    inner = HEADS * HEAD_DIM
    self_attention = LAYERS * 4 * inner * tokens * tokens
    cross_attention = LAYERS * 4 * inner * tokens * text_tokens
    attention = self_attention + cross_attention
    assert meta["attention_share_forward"] * meta["forward"] == pytest.approx(attention, rel=1e-12)
    # the same forward on real tensors, whose CPU attention kernel the counter now knows
    assert real["forward"] == meta["forward"] > 0
    # backward: on meta the attention runs as two matmuls, so autograd computes only the
    # gradients needed: dQ, dK, dV of self-attention (twice its forward), dQ alone of the
    # cross-attention (its keys and values come from the text, which needs no gradient: once
    # its forward). The fused kernel on real tensors computes dK and dV there too.
    assert meta["attention_share_backward"] * meta["backward"] == pytest.approx(
        2 * self_attention + cross_attention, rel=1e-12
    )
    assert real["backward"] == meta["backward"] + cross_attention


def test_frames_must_fit_the_causal_vae(wan_flops) -> None:
    with pytest.raises(SystemExit, match="--frames must be 4k \\+ 1"):
        wan_flops.latent_shape(frames=80, height=480, width=832)
