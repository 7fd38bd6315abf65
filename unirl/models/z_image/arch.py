"""``z-image-arch``: random weights at the released Z-Image shapes, for benchmarks.

Built in memory on the target device, in the target dtypes (never saved): speed does not
depend on the weights' values. Shapes are those of ``Tongyi-MAI/Z-Image`` (and of the Turbo
checkpoint, which shares them): the 6.15 B single-stream DiT (30 layers + 2 noise and 2
context refiner layers, width 3840, 30 heads of 128), the Qwen3-4B text encoder, the
FLUX-format 16-channel VAE. Tokenizer: the tiny preset's locally trained BPE tokenizer (ids <
1000, valid in the real vocabulary); sequence lengths and every module shape are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from unirl.models.common.arch import ArchSpec, SingleEncoderArch
from unirl.models.common.config_dict import ConfigDict
from unirl.models.z_image.tiny import SCHEDULER_CONFIG

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(kw_only=True, frozen=True)
class ZImageArchSpec(ArchSpec):
    """Configs of one architecture preset (plain dicts, as in the released ``config.json``)."""

    text_encoder: ConfigDict
    scheduler: ConfigDict = field(default_factory=lambda: dict(SCHEDULER_CONFIG))


def z_image_arch_spec() -> ZImageArchSpec:
    """The released ``Tongyi-MAI/Z-Image`` component shapes."""
    return ZImageArchSpec(
        name="z-image-arch",
        transformer={
            "all_patch_size": [2],
            "all_f_patch_size": [1],
            "in_channels": 16,
            "dim": 3840,
            "n_layers": 30,
            "n_refiner_layers": 2,
            "n_heads": 30,
            "n_kv_heads": 30,
            "norm_eps": 1e-5,
            "qk_norm": True,
            "cap_feat_dim": 2560,
            "rope_theta": 256.0,
            "t_scale": 1000.0,
            "axes_dims": [32, 48, 48],
            "axes_lens": [1536, 512, 512],
        },
        vae={  # the FLUX.1 autoencoder
            "in_channels": 3,
            "out_channels": 3,
            "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4,
            "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2,
            "act_fn": "silu",
            "latent_channels": 16,
            "norm_num_groups": 32,
            "sample_size": 1024,
            "scaling_factor": 0.3611,
            "shift_factor": 0.1159,
            "use_quant_conv": False,
            "use_post_quant_conv": False,
            "force_upcast": True,
        },
        text_encoder={  # Qwen3-4B (loaded as Qwen3Model: no LM head)
            "vocab_size": 151936,
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
    )


ARCH_SPECS = {"z-image-arch": z_image_arch_spec}


def _transformer(spec: ZImageArchSpec) -> torch.nn.Module:
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel

    return ZImageTransformer2DModel(**spec.transformer)


def _text_encoder(spec: ZImageArchSpec, pad_token_id: int | None = None) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3Model

    cfg = dict(spec.text_encoder)
    if pad_token_id is not None:
        cfg["pad_token_id"] = pad_token_id
    return Qwen3Model(Qwen3Config.from_dict(cfg))


def _vae(spec: ZImageArchSpec) -> torch.nn.Module:
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

    return AutoencoderKL(**spec.vae)


def _tokenizer() -> PreTrainedTokenizerBase:
    from unirl.models.z_image.tiny import TinyZImageSpec, build_tiny_tokenizer

    return build_tiny_tokenizer(TinyZImageSpec())


ARCH = SingleEncoderArch(
    transformer=_transformer, vae=_vae, text_encoder=_text_encoder, tokenizer=_tokenizer
)
count_params = ARCH.count_params
build_arch_modules = ARCH.build
