"""``qwen-image-arch``: random weights at the released Qwen-Image shapes, for benchmarks.

Built in memory on the target device, in the target dtypes (never saved): speed does not
depend on the weights' values. The 20 B-parameter transformer is initialised directly in its
dtype (an fp32 copy would not fit an 80 GB card). Tokenizer: the tiny preset's locally
trained BPE tokenizer (ids < 1000, valid in the real vocabulary); sequence lengths and every
module shape are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from unirl.models.common.arch import ArchSpec, SingleEncoderArch
from unirl.models.common.config_dict import ConfigDict, config_dict
from unirl.models.qwen_image.tiny import SCHEDULER_CONFIG

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(kw_only=True, frozen=True)
class QwenImageArchSpec(ArchSpec):
    """Configs of one architecture preset (plain dicts, as in the released ``config.json``)."""

    text_encoder: ConfigDict
    scheduler: ConfigDict = field(default_factory=lambda: dict(SCHEDULER_CONFIG))


def qwen_image_arch_spec() -> QwenImageArchSpec:
    """The released ``Qwen/Qwen-Image`` component shapes (MMDiT 60 x 24 heads of 128,
    Qwen2.5-VL-7B text encoder, the Wan-style 16-channel VAE)."""
    return QwenImageArchSpec(
        name="qwen-image-arch",
        transformer={
            "patch_size": 2,
            "in_channels": 64,
            "out_channels": 16,
            "num_layers": 60,
            "attention_head_dim": 128,
            "num_attention_heads": 24,
            "joint_attention_dim": 3584,
            "guidance_embeds": False,
            "axes_dims_rope": [16, 56, 56],
        },
        vae={
            "base_dim": 96,
            "z_dim": 16,
            "dim_mult": [1, 2, 4, 4],
            "num_res_blocks": 2,
            "attn_scales": [],
            "temperal_downsample": [False, True, True],
            "dropout": 0.0,
        },
        text_encoder={  # Qwen2.5-VL-7B-Instruct
            "text_config": {
                "vocab_size": 152064,
                "hidden_size": 3584,
                "intermediate_size": 18944,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "max_position_embeddings": 128000,
                "rms_norm_eps": 1e-6,
                "hidden_act": "silu",
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "mrope_section": [16, 24, 24],
                },
                "bos_token_id": 151643,
                "eos_token_id": 151645,
            },
            "vision_config": {
                "depth": 32,
                "hidden_size": 1280,
                "intermediate_size": 3420,
                "num_heads": 16,
                "out_hidden_size": 3584,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "window_size": 112,
                "fullatt_block_indexes": [7, 15, 23, 31],
                "tokens_per_second": 2,
            },
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
        },
    )


ARCH_SPECS = {"qwen-image-arch": qwen_image_arch_spec}


def _transformer(spec: QwenImageArchSpec) -> torch.nn.Module:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(**spec.transformer)


def _text_encoder(spec: QwenImageArchSpec, pad_token_id: int | None = None) -> torch.nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = dict(spec.text_encoder)
    text = config_dict(cfg, "text_config")
    if pad_token_id is not None:
        text["pad_token_id"] = pad_token_id
    return Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig.from_dict({**cfg, "text_config": text})
    )


def _vae(spec: QwenImageArchSpec) -> torch.nn.Module:
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(**spec.vae)


def _tokenizer() -> PreTrainedTokenizerBase:
    from unirl.models.qwen_image.tiny import TinyQwenImageSpec, build_tiny_tokenizer

    return build_tiny_tokenizer(TinyQwenImageSpec())


ARCH = SingleEncoderArch(
    transformer=_transformer, vae=_vae, text_encoder=_text_encoder, tokenizer=_tokenizer
)
count_params = ARCH.count_params
build_arch_modules = ARCH.build
