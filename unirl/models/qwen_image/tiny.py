"""The ``tiny`` Qwen-Image stack: every component at toy size, built from configs, no download.

Components are the real diffusers / transformers classes (``QwenImageTransformer2DModel``,
``AutoencoderKLQwenImage``, ``Qwen2_5_VLForConditionalGeneration``, ``Qwen2Tokenizer``), so
the saved folder is a valid ``QwenImagePipeline`` layout; only sizes and two initialisations
are ours:

- the tokenizer is a byte-level BPE trained on the bundled corpus wrapped in the pipeline's
  chat template, with Qwen's special tokens; the build checks that the template prefix is
  exactly the pipeline's ``drop_idx`` tokens, as with the real tokenizer;
- the VAE decoder is reshaped into a near-linear, smooth up-projection
  (:func:`shape_tiny_decoder`, ``models/common/tiny_causal_vae.py``): a random decoder barely
  reacts to its latents, which would make pixel rewards unlearnable.

The scheduler config is the released model's (dynamic shift, terminal σ 0.02).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.config_dict import ConfigDict, JSONValue
from unirl.models.common.text_encode import token_id
from unirl.models.common.tiny import corpus_lines
from unirl.models.common.tiny_causal_vae import CausalBlocks, TinyCausalDecoder
from unirl.models.common.tiny_text import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    qwen_bpe_tokenizer,
    tiny_qwen_text_config,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen2_5_VLConfig

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# The released Qwen/Qwen-Image scheduler (FlowMatchEulerDiscreteScheduler) config.
SCHEDULER_CONFIG: ConfigDict = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 0.9,
    "base_image_seq_len": 256,
    "max_image_seq_len": 8192,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
    "invert_sigmas": False,
    "stochastic_sampling": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}


@dataclass(kw_only=True, frozen=True)
class TinyQwenImageSpec:
    """Sizes of the tiny stack (about 0.7 M parameters in all)."""

    seed: int = 0
    vocab_size: int = 1000
    # Qwen2.5-VL text encoder (head dim 16: mrope sections sum to 8) with a one-block vision tower
    text_hidden: int = 32
    text_intermediate: int = 64
    text_layers: int = 2
    text_heads: int = 2
    text_kv_heads: int = 1
    mrope_section: tuple[int, int, int] = (2, 3, 3)
    vision_hidden: int = 16
    vision_heads: int = 2
    # transformer (MMDiT); rope axes sum to the head dim
    num_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 32
    axes_dims_rope: tuple[int, int, int] = (8, 12, 12)
    # VAE (Qwen-Image latent format: 16 channels, 8x, per-channel mean / std)
    latent_channels: int = 16
    vae_base_dim: int = 16
    vae_levels: int = 4
    # decoder shaping (see shape_tiny_decoder)
    decoder_signal_channels: int = 6
    decoder_anchor_channels: int = 2
    decoder_anchor_value: float = 20.0
    decoder_activation_std: float = 0.35
    decoder_gain: float = 1.6
    decoder_residual_damping: float = 0.05


# -- tokenizer -----------------------------------------------------------------------------------


def build_tiny_tokenizer(
    spec: TinyQwenImageSpec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A ``Qwen2Tokenizer`` (byte-level BPE) trained on the corpus wrapped in the pipeline's
    template, so the template words are whole tokens and its prefix is ``drop_idx`` tokens.
    Special tokens first: ``<|endoftext|>`` (pad, id 0), ``<|im_start|>``, ``<|im_end|>`` and
    the vision tokens (never produced from text)."""
    from unirl.models.qwen_image.text_encode import pipeline_prompt_template

    template = pipeline_prompt_template()
    lines = corpus_lines() if lines is None else lines
    tokenizer = qwen_bpe_tokenizer(
        [template.text.format(line) for line in lines],
        specials=[ENDOFTEXT, IM_START, IM_END, *VISION_TOKENS],
        vocab_size=spec.vocab_size,
        model_max_length=template.max_length + template.drop_idx,
    )
    prefix = len(tokenizer(template.prefix).input_ids)
    if prefix != template.drop_idx:
        raise ValueError(
            f"the tiny tokenizer splits the prompt template's prefix into {prefix} tokens, the "
            f"pipeline drops {template.drop_idx}; grow TinyQwenImageSpec.vocab_size"
        )
    return tokenizer


# -- model configs -------------------------------------------------------------------------------


def transformer_config(spec: TinyQwenImageSpec) -> ConfigDict:
    return {
        "patch_size": 2,
        "in_channels": 4 * spec.latent_channels,
        "out_channels": spec.latent_channels,
        "num_layers": spec.num_layers,
        "attention_head_dim": spec.attention_head_dim,
        "num_attention_heads": spec.num_attention_heads,
        "joint_attention_dim": spec.text_hidden,
        "guidance_embeds": False,
        "axes_dims_rope": list(spec.axes_dims_rope),
    }


def vae_config(spec: TinyQwenImageSpec) -> ConfigDict:
    gen = torch.Generator().manual_seed(spec.seed + 6)
    z = spec.latent_channels
    # non-trivial per-channel statistics, so a wrong un-normalisation shows
    mean = (torch.rand(z, generator=gen) - 0.5).tolist()
    std = (0.5 + 1.5 * torch.rand(z, generator=gen)).tolist()
    temporal_downsample: list[JSONValue] = [False, *[True] * (spec.vae_levels - 2)]
    return {
        "base_dim": spec.vae_base_dim,
        "z_dim": z,
        "dim_mult": [1] * spec.vae_levels,
        "num_res_blocks": 1,
        "attn_scales": [],
        "temperal_downsample": temporal_downsample,
        "dropout": 0.0,
        "latents_mean": [round(v, 4) for v in mean],
        "latents_std": [round(v, 4) for v in std],
    }


def text_encoder_config(
    spec: TinyQwenImageSpec, tokenizer: PreTrainedTokenizerBase
) -> Qwen2_5_VLConfig:
    from transformers import Qwen2_5_VLConfig

    ids = [token_id(tokenizer, t) for t in VISION_TOKENS]
    return Qwen2_5_VLConfig(
        text_config={
            **tiny_qwen_text_config(spec, tokenizer),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": list(spec.mrope_section),
            },
        },
        vision_config={
            "depth": 1,
            "hidden_size": spec.vision_hidden,
            "intermediate_size": 2 * spec.vision_hidden,
            "num_heads": spec.vision_heads,
            "out_hidden_size": spec.text_hidden,
            "fullatt_block_indexes": [0],
        },
        vision_start_token_id=ids[0],
        vision_end_token_id=ids[1],
        image_token_id=ids[2],
        video_token_id=ids[3],
    )


# -- the decoder trap ----------------------------------------------------------------------------


def shape_tiny_decoder(vae: Any, spec: TinyQwenImageSpec, generator: torch.Generator) -> None:
    """Make the random ``AutoencoderKLQwenImage`` decoder a smooth, strongly responsive
    up-projection of the latent (``models/common/tiny_causal_vae.py``; images: one frame,
    temporal upsamplers untouched), centred over 16 latents of 8x8."""
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
        QwenImageAttentionBlock,
        QwenImageResample,
        QwenImageResidualBlock,
    )

    blocks = CausalBlocks(QwenImageResidualBlock, QwenImageResample, QwenImageAttentionBlock)
    TinyCausalDecoder.from_spec(spec).shape(
        vae, generator, blocks=blocks, temporal=False, centre_batch=(16, 1, 8, 8)
    )


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinyQwenImageSpec) -> Any:
    """The tiny stack as an in-memory diffusers ``QwenImagePipeline`` (fp32, CPU, seeded)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tiny_tokenizer(spec)
    # One seed per component, so resizing one leaves the others' weights unchanged; the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = QwenImageTransformer2DModel(**transformer_config(spec))
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKLQwenImage(**vae_config(spec))
        shape_tiny_decoder(vae, spec, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        text_encoder = Qwen2_5_VLForConditionalGeneration(text_encoder_config(spec, tokenizer))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
