"""``sd3.5-medium-arch``: random weights at the released SD3.5-Medium shapes, for benchmarks.

Built in memory on the target device (never saved): speed does not depend on the weights'
values, so this measures what a real checkpoint would cost without downloading one.
Tokenizers are the tiny preset's locally trained BPE tokenizers (ids < 1000, valid in the
real vocabularies); sequence lengths (77 CLIP tokens, ``max_sequence_length`` T5 tokens)
are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from unirl.models.common.arch import ArchSpec, built_as, count_params_on_meta
from unirl.models.common.config_dict import ConfigDict


@dataclass(kw_only=True, frozen=True)
class SD3ArchSpec(ArchSpec):
    """Configs of one architecture preset (plain dicts, as in the released ``config.json`` files)."""

    clip_l: ConfigDict
    clip_g: ConfigDict
    t5: ConfigDict
    scheduler: ConfigDict = field(
        default_factory=lambda: {"num_train_timesteps": 1000, "shift": 3.0}
    )


def sd35_medium_arch_spec() -> SD3ArchSpec:
    """The released ``stabilityai/stable-diffusion-3.5-medium`` component shapes."""
    return SD3ArchSpec(
        name="sd3.5-medium-arch",
        transformer={
            "sample_size": 128,
            "patch_size": 2,
            "in_channels": 16,
            "out_channels": 16,
            "num_layers": 24,
            "attention_head_dim": 64,
            "num_attention_heads": 24,
            "joint_attention_dim": 4096,
            "caption_projection_dim": 1536,
            "pooled_projection_dim": 2048,
            "pos_embed_max_size": 384,
            "dual_attention_layers": tuple(range(13)),
            "qk_norm": "rms_norm",
        },
        vae={
            "in_channels": 3,
            "out_channels": 3,
            "down_block_types": ("DownEncoderBlock2D",) * 4,
            "up_block_types": ("UpDecoderBlock2D",) * 4,
            "block_out_channels": (128, 256, 512, 512),
            "layers_per_block": 2,
            "latent_channels": 16,
            "norm_num_groups": 32,
            "sample_size": 1024,
            "scaling_factor": 1.5305,
            "shift_factor": 0.0609,
            "use_quant_conv": False,
            "use_post_quant_conv": False,
            "force_upcast": True,
        },
        clip_l={  # OpenAI CLIP ViT-L/14 text tower with projection
            "vocab_size": 49408,
            "hidden_size": 768,
            "intermediate_size": 3072,
            "projection_dim": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "max_position_embeddings": 77,
            "hidden_act": "quick_gelu",
        },
        clip_g={  # OpenCLIP ViT-bigG/14 text tower with projection
            "vocab_size": 49408,
            "hidden_size": 1280,
            "intermediate_size": 5120,
            "projection_dim": 1280,
            "num_hidden_layers": 32,
            "num_attention_heads": 20,
            "max_position_embeddings": 77,
            "hidden_act": "gelu",
        },
        t5={  # T5 v1.1 XXL encoder
            "vocab_size": 32128,
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
            "is_encoder_decoder": False,
            "use_cache": False,
            "tie_word_embeddings": False,
        },
    )


ARCH_SPECS = {"sd3.5-medium-arch": sd35_medium_arch_spec}


def count_transformer_params(spec: SD3ArchSpec) -> int:
    """Parameter count of the spec's transformer, built on the meta device (no allocation)."""
    from diffusers.models.transformers.transformer_sd3 import SD3Transformer2DModel

    factory = {"transformer": lambda: SD3Transformer2DModel(**spec.transformer)}
    return count_params_on_meta(factory)["transformer"]


def build_arch_modules(
    spec: SD3ArchSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
    text_encoder_dtype: torch.dtype,
    vae_dtype: torch.dtype,
    build_t5: bool,
    seed: int = 0,
) -> dict[str, Any]:
    """Random-init modules of ``spec`` on ``device``; tokenizers from the tiny preset's trainer.

    Each module is initialised in fp32 directly on ``device`` and cast right away, so peak
    memory is one module in fp32 (T5-XXL: ~19 GB) plus the others in their dtypes.
    ``build_t5=False`` skips the 4.7 B-parameter T5-XXL; the caller then supplies placeholder
    T5 embeddings (``SD3BundleConfig.skip_t5``).
    """
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from unirl.models.sd3.tiny import TinySD3Spec, build_tiny_tokenizers

    tok_l, tok_g, tok_t5 = build_tiny_tokenizers(TinySD3Spec())
    special = {"bos_token_id": tok_l.bos_token_id, "eos_token_id": tok_l.eos_token_id}

    def make(factory: Any, out_dtype: torch.dtype, offset: int) -> Any:
        with built_as(seed + offset, device):
            module = factory()
        # diffusers' ModelMixin.to(dtype) warns about fp32-pinned modules even when it has
        # none; cast through nn.Module.to in that case (same result, no noise).
        if getattr(module, "_keep_in_fp32_modules", None):
            return module.to(dtype=out_dtype).eval()
        return torch.nn.Module.to(module, dtype=out_dtype).eval()

    modules: dict[str, Any] = {
        "tokenizer": tok_l,
        "tokenizer_2": tok_g,
        "tokenizer_3": tok_t5,
        "transformer": make(lambda: SD3Transformer2DModel(**spec.transformer), dtype, 0),
        "vae": make(lambda: AutoencoderKL(**spec.vae), vae_dtype, 1),
        "text_encoder": make(
            lambda: CLIPTextModelWithProjection(
                CLIPTextConfig.from_dict(
                    {**spec.clip_l, "pad_token_id": tok_l.pad_token_id, **special}
                )
            ),
            text_encoder_dtype,
            2,
        ),
        "text_encoder_2": make(
            lambda: CLIPTextModelWithProjection(
                CLIPTextConfig.from_dict(
                    {**spec.clip_g, "pad_token_id": tok_g.pad_token_id, **special}
                )
            ),
            text_encoder_dtype,
            3,
        ),
        "text_encoder_3": None,
        "scheduler_config": dict(spec.scheduler),
    }
    if build_t5:
        modules["text_encoder_3"] = make(
            lambda: T5EncoderModel(
                T5Config.from_dict({**spec.t5, "pad_token_id": 0, "eos_token_id": 1})
            ),
            text_encoder_dtype,
            4,
        )
    return modules
