"""``hunyuan-video-arch``: random weights at the released HunyuanVideo 1.0 shapes.

Built in memory on the target device, in the target dtypes (never saved): speed does not
depend on the weights' values. Tokenizers: the tiny preset's (ids < 1000, valid in the real
vocabularies; the Llama one's template prefix is the pipeline's 95 tokens); sequence lengths
and every module shape are the real ones.

``hunyuanvideo-community/HunyuanVideo``: 20 dual-stream and 40 single-stream blocks (24 heads
x 128, MLP 4x, 2x2 patches, 16 latent channels, a guidance embedding), llava-llama-3-8b's
language model as the text encoder (read at its third-to-last layer), CLIP ViT-L/14's text
model for the pooled projection, the 16-channel VAE (8x spatial, 4x temporal), flow shift 7.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from unirl.models.common.arch import built_as
from unirl.models.common.config_dict import ConfigDict

# transformer/config.json of hunyuanvideo-community/HunyuanVideo
TRANSFORMER: ConfigDict = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "guidance_embeds": True,
    "text_embed_dim": 4096,
    "pooled_projection_dim": 768,
    "rope_theta": 256.0,
    "rope_axes_dim": [16, 56, 56],
    "image_condition_type": None,
}

VAE: ConfigDict = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
    "up_block_types": ["HunyuanVideoUpBlock3D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "scaling_factor": 0.476986,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 4,
    "mid_block_add_attention": True,
}

# xtuner/llava-llama-3-8b-v1_1-transformers, the language model only
LLAMA3_8B: ConfigDict = {
    "vocab_size": 128320,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

# openai/clip-vit-large-patch14, the text model
CLIP_L: ConfigDict = {
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "projection_dim": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "bos_token_id": 49406,
    "eos_token_id": 49407,
    "pad_token_id": 1,
}


@dataclass(kw_only=True, frozen=True)
class HunyuanVideoArchSpec:
    """Configs of one architecture preset (plain dicts, as in the released ``config.json``)."""

    name: str
    transformer: ConfigDict
    vae: ConfigDict
    text_encoder: ConfigDict
    text_encoder_2: ConfigDict
    scheduler: ConfigDict = field(
        default_factory=lambda: {"num_train_timesteps": 1000, "shift": 7.0}
    )


def hunyuan_video_arch_spec() -> HunyuanVideoArchSpec:
    """``hunyuanvideo-community/HunyuanVideo`` shapes."""
    return HunyuanVideoArchSpec(
        name="hunyuan-video-arch",
        transformer=dict(TRANSFORMER),
        vae=dict(VAE),
        text_encoder=dict(LLAMA3_8B),
        text_encoder_2=dict(CLIP_L),
    )


ARCH_SPECS = {"hunyuan-video-arch": hunyuan_video_arch_spec}


def _build_transformer(config: ConfigDict) -> torch.nn.Module:
    from diffusers import HunyuanVideoTransformer3DModel

    return HunyuanVideoTransformer3DModel(**config)


def _build_text_encoder(spec: HunyuanVideoArchSpec) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel

    return LlamaModel(LlamaConfig.from_dict(dict(spec.text_encoder)))


def _build_clip(spec: HunyuanVideoArchSpec) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig.from_dict(dict(spec.text_encoder_2)))


def count_params(spec: HunyuanVideoArchSpec) -> dict[str, int]:
    """Parameter counts of the transformer and both text encoders, built on the meta device
    (no allocation)."""

    def numel(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        return {
            "transformer": numel(_build_transformer(spec.transformer)),
            "text_encoder": numel(_build_text_encoder(spec)),
            "text_encoder_2": numel(_build_clip(spec)),
        }


def build_arch_modules(
    spec: HunyuanVideoArchSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
    text_encoder_dtype: torch.dtype,
    vae_dtype: torch.dtype,
    seed: int = 0,
) -> dict[str, Any]:
    """Random-init modules of ``spec`` on ``device``, each built in its own dtype; the
    tokenizers are the tiny preset's."""
    from diffusers import AutoencoderKLHunyuanVideo

    from unirl.models.hunyuan_video_v1.tiny import (
        TinyHunyuanVideoSpec,
        build_clip_tokenizer,
        build_tiny_tokenizer,
    )

    tiny = TinyHunyuanVideoSpec()
    parts: dict[str, Any] = {
        "tokenizer": build_tiny_tokenizer(tiny),
        "tokenizer_2": build_clip_tokenizer(tiny),
        "scheduler_config": dict(spec.scheduler),
    }
    with built_as(seed, device, dtype):
        parts["transformer"] = _build_transformer(spec.transformer).eval()
    with built_as(seed + 1, device, vae_dtype):
        parts["vae"] = AutoencoderKLHunyuanVideo(**spec.vae).eval()
    with built_as(seed + 2, device, text_encoder_dtype):
        parts["text_encoder"] = _build_text_encoder(spec).eval()
    with built_as(seed + 3, device, text_encoder_dtype):
        parts["text_encoder_2"] = _build_clip(spec).eval()
    return parts
