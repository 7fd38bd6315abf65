"""``hunyuan-video-1.5-arch``: random weights at the released HunyuanVideo 1.5 shapes.

Built in memory on the target device, in the target dtypes (never saved): speed does not
depend on the weights' values. The transformer is initialised directly in its dtype.
Tokenizers: the tiny preset's locally trained Qwen tokenizer (ids < 1000, valid in the real
vocabulary, and its chat template's prefix is the pipeline's 108 tokens) and ByT5's byte
tokenizer; sequence lengths and every module shape are the real ones.

``hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v``: a 54-block dual-stream DiT
(16 heads x 128, MLP 4x, patch 1, 65 input channels: noise, condition latents, mask), the
Qwen2.5-VL-7B language model as the text encoder (read at its third-to-last layer), ByT5-small
(1472 wide) as the glyph encoder, the 32-channel VAE (16x spatial, 4x temporal), flow shift 5.
The glyph tokenizer of the release adds colour and font tokens to ByT5's 384; the arch
preset keeps 384 (an embedding row count, nothing the speed depends on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from unirl.models.common.arch import built_as
from unirl.models.common.config_dict import ConfigDict

# transformer/config.json of the 480p text-to-video release (its task_type is "i2v": one
# checkpoint takes image conditioning too; text-to-video passes it as zeros)
TRANSFORMER_480P_T2V: ConfigDict = {
    "in_channels": 65,
    "out_channels": 32,
    "num_attention_heads": 16,
    "attention_head_dim": 128,
    "num_layers": 54,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 1,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "text_embed_dim": 3584,
    "text_embed_2_dim": 1472,
    "image_embed_dim": 1152,
    "rope_theta": 256.0,
    "rope_axes_dim": [16, 56, 56],
    "target_size": 640,
    "task_type": "i2v",
    "use_meanflow": False,
}

VAE: ConfigDict = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 32,
    "block_out_channels": [128, 256, 512, 1024, 1024],
    "layers_per_block": 2,
    "spatial_compression_ratio": 16,
    "temporal_compression_ratio": 4,
    "downsample_match_channel": True,
    "upsample_match_channel": True,
    "scaling_factor": 1.03682,
}

# Qwen/Qwen2.5-VL-7B-Instruct, the language model only
QWEN25_VL_7B_TEXT: ConfigDict = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [16, 24, 24],
    },
    "tie_word_embeddings": False,
    "bos_token_id": None,
}

# google/byt5-small, the encoder
BYT5_SMALL: ConfigDict = {
    "vocab_size": 384,
    "d_model": 1472,
    "d_kv": 64,
    "d_ff": 3584,
    "num_layers": 12,
    "num_heads": 6,
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
class HunyuanVideo15ArchSpec:
    """Configs of one architecture preset (plain dicts, as in the released ``config.json``)."""

    name: str
    transformer: ConfigDict
    vae: ConfigDict
    text_encoder: ConfigDict
    text_encoder_2: ConfigDict
    scheduler: ConfigDict = field(
        default_factory=lambda: {"num_train_timesteps": 1000, "shift": 5.0}
    )


def hunyuan_video15_arch_spec() -> HunyuanVideo15ArchSpec:
    """``hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v`` shapes."""
    return HunyuanVideo15ArchSpec(
        name="hunyuan-video-1.5-arch",
        transformer=dict(TRANSFORMER_480P_T2V),
        vae=dict(VAE),
        text_encoder=dict(QWEN25_VL_7B_TEXT),
        text_encoder_2=dict(BYT5_SMALL),
    )


ARCH_SPECS = {"hunyuan-video-1.5-arch": hunyuan_video15_arch_spec}


def _build_transformer(config: ConfigDict) -> torch.nn.Module:
    from diffusers import HunyuanVideo15Transformer3DModel

    return HunyuanVideo15Transformer3DModel(**config)


def _build_text_encoder(spec: HunyuanVideo15ArchSpec) -> torch.nn.Module:
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    return Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig.from_dict(dict(spec.text_encoder)))


def _build_glyph_encoder(spec: HunyuanVideo15ArchSpec) -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config.from_dict(dict(spec.text_encoder_2)))


def count_params(spec: HunyuanVideo15ArchSpec) -> dict[str, int]:
    """Parameter counts of the transformer and both text encoders, built on the meta device
    (no allocation)."""

    def numel(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        return {
            "transformer": numel(_build_transformer(spec.transformer)),
            "text_encoder": numel(_build_text_encoder(spec)),
            "text_encoder_2": numel(_build_glyph_encoder(spec)),
        }


def build_arch_modules(
    spec: HunyuanVideo15ArchSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
    text_encoder_dtype: torch.dtype,
    vae_dtype: torch.dtype,
    seed: int = 0,
) -> dict[str, Any]:
    """Random-init modules of ``spec`` on ``device``, each built in its own dtype; the Qwen
    tokenizer is the tiny preset's, the glyph tokenizer ByT5's."""
    from diffusers import AutoencoderKLHunyuanVideo15

    from unirl.models.hunyuan_video.tiny import (
        TinyHunyuanVideo15Spec,
        build_glyph_tokenizer,
        build_tiny_tokenizer,
    )

    parts: dict[str, Any] = {
        "tokenizer": build_tiny_tokenizer(TinyHunyuanVideo15Spec()),
        "tokenizer_2": build_glyph_tokenizer(),
        "scheduler_config": dict(spec.scheduler),
    }
    with built_as(seed, device, dtype):
        parts["transformer"] = _build_transformer(spec.transformer).eval()
    with built_as(seed + 1, device, vae_dtype):
        parts["vae"] = AutoencoderKLHunyuanVideo15(**spec.vae).eval()
    with built_as(seed + 2, device, text_encoder_dtype):
        parts["text_encoder"] = _build_text_encoder(spec).eval()
    with built_as(seed + 3, device, text_encoder_dtype):
        parts["text_encoder_2"] = _build_glyph_encoder(spec).eval()
    return parts
