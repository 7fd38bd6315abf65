"""``wan2.1-1.3b-arch`` and ``wan2.2-14b-arch``: random weights at the released Wan shapes.

Built in memory on the target device, in the target dtypes (never saved): speed does not
depend on the weights' values. Each transformer is initialised directly in its dtype (a 14 B
fp32 copy would not fit an 80 GB card). Tokenizer: the tiny preset's locally trained BPE
tokenizer (ids < 1000, valid in the real vocabulary); sequence lengths and every module shape
are the real ones.

- ``wan2.1-1.3b-arch``: ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` — 30 blocks, 12 heads x 128,
  FFN 8960; UMT5-XXL encoder; the Wan 2.1 VAE (base 96, 16 latent channels).
- ``wan2.2-14b-arch``: ``Wan-AI/Wan2.2-T2V-A14B-Diffusers`` — two 14 B experts (40 blocks,
  40 heads x 128, FFN 13824) switched at ``boundary_ratio`` 0.875; same encoder and VAE.

Both use flow shift 3.0 (the released 480p setting).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from unirl.models.common.arch import built_as
from unirl.models.common.config_dict import ConfigDict


def _transformer(
    *, heads: int, ffn: int, layers: int, in_channels: int = 16, image_dim: int | None = None
) -> ConfigDict:
    return {
        "patch_size": [1, 2, 2],
        "num_attention_heads": heads,
        "attention_head_dim": 128,
        "in_channels": in_channels,
        "out_channels": 16,
        "text_dim": 4096,
        "freq_dim": 256,
        "ffn_dim": ffn,
        "num_layers": layers,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": image_dim,
        "added_kv_proj_dim": None if image_dim is None else heads * 128,
        "rope_max_seq_len": 1024,
    }


# The Wan 2.1 VAE (also Wan 2.2 A14B's); latents_mean / latents_std are diffusers' defaults,
# the released statistics.
WAN21_VAE: ConfigDict = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}

# google/umt5-xxl, encoder only
UMT5_XXL: ConfigDict = {
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.0,
    "tie_word_embeddings": False,
    "is_encoder_decoder": False,
    "use_cache": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}


@dataclass(kw_only=True, frozen=True)
class WanArchSpec:
    """Configs of one architecture preset (plain dicts, as in the released ``config.json``);
    ``transformer_2`` and ``boundary_ratio`` are set for Wan 2.2's two experts."""

    name: str
    transformer: ConfigDict
    vae: ConfigDict
    text_encoder: ConfigDict
    transformer_2: ConfigDict | None = None
    boundary_ratio: float | None = None
    scheduler: ConfigDict = field(
        default_factory=lambda: {"num_train_timesteps": 1000, "shift": 3.0}
    )


def wan21_1_3b_arch_spec() -> WanArchSpec:
    """``Wan-AI/Wan2.1-T2V-1.3B-Diffusers`` shapes."""
    return WanArchSpec(
        name="wan2.1-1.3b-arch",
        transformer=_transformer(heads=12, ffn=8960, layers=30),
        vae=dict(WAN21_VAE),
        text_encoder=dict(UMT5_XXL),
    )


def wan22_14b_arch_spec() -> WanArchSpec:
    """``Wan-AI/Wan2.2-T2V-A14B-Diffusers`` shapes: two 14 B experts, boundary 0.875."""
    expert = _transformer(heads=40, ffn=13824, layers=40)
    return WanArchSpec(
        name="wan2.2-14b-arch",
        transformer=expert,
        transformer_2=dict(expert),
        boundary_ratio=0.875,
        vae=dict(WAN21_VAE),
        text_encoder=dict(UMT5_XXL),
    )


ARCH_SPECS = {
    "wan2.1-1.3b-arch": wan21_1_3b_arch_spec,
    "wan2.2-14b-arch": wan22_14b_arch_spec,
}


def _build_transformer(config: ConfigDict) -> torch.nn.Module:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(**config)


def _build_text_encoder(spec: WanArchSpec) -> torch.nn.Module:
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config.from_dict(dict(spec.text_encoder)))


def count_params(spec: WanArchSpec) -> dict[str, int]:
    """Parameter counts of each transformer and the text encoder, built on the meta device
    (no allocation)."""

    def numel(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        counts = {
            "transformer": numel(_build_transformer(spec.transformer)),
            "text_encoder": numel(_build_text_encoder(spec)),
        }
        if spec.transformer_2 is not None:
            counts["transformer_2"] = numel(_build_transformer(spec.transformer_2))
    return counts


def build_arch_modules(
    spec: WanArchSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
    text_encoder_dtype: torch.dtype,
    vae_dtype: torch.dtype,
    seed: int = 0,
) -> dict[str, Any]:
    """Random-init modules of ``spec`` on ``device``, each built in its own dtype; the
    tokenizer is the tiny preset's."""
    from diffusers import AutoencoderKLWan

    from unirl.models.wan.tiny import TinyWanSpec, build_tiny_tokenizer

    parts: dict[str, Any] = {
        "tokenizer": build_tiny_tokenizer(TinyWanSpec()),
        "scheduler_config": dict(spec.scheduler),
        "boundary_ratio": spec.boundary_ratio,
        "transformer_2": None,
        "image_encoder": None,
        "image_processor": None,
    }
    with built_as(seed, device, dtype):
        parts["transformer"] = _build_transformer(spec.transformer).eval()
    if spec.transformer_2 is not None:
        with built_as(seed + 4, device, dtype):
            parts["transformer_2"] = _build_transformer(spec.transformer_2).eval()
    with built_as(seed + 1, device, vae_dtype):
        parts["vae"] = AutoencoderKLWan(**spec.vae).eval()
    with built_as(seed + 2, device, text_encoder_dtype):
        parts["text_encoder"] = _build_text_encoder(spec).eval()
    return parts
