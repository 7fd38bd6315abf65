"""The ``tiny`` FLUX.2-Klein stack: every component at toy size, built from configs, no download.

Components are the real diffusers / transformers classes (``Flux2Transformer2DModel``,
``AutoencoderKLFlux2``, ``Qwen3ForCausalLM``, ``Qwen2Tokenizer``), so the saved folder is a
valid ``Flux2KleinPipeline`` layout; only sizes and three initialisations are ours:

- the tokenizer is a byte-level BPE trained on the bundled corpus wrapped in the chat turn the
  pipeline builds (generation prompt, thinking switched off), with Qwen's chat tokens and our
  template that renders plain turns as Qwen3's does (``common.tiny_text``, Z-Image's too);
- the text encoder has 28 thin layers, so the pipeline's hidden states 9, 18 and 27 exist;
- the VAE decoder is reshaped into a near-linear, smooth up-projection (the shared
  :meth:`~unirl.models.common.tiny_vae.TinyKLVAE.shape_decoder`: the decoder is the same
  diffusers ``Decoder`` as SD3's), then re-centred for this VAE's batch-norm latent
  statistics, which are set to non-trivial values so a wrong (un)normalisation shows. A
  random decoder barely reacts to its latents, which would make pixel rewards unlearnable.

``is_distilled`` picks the variant: ``True`` (the default, like ``FLUX.2-klein-4B``: no CFG)
or ``False`` (like ``FLUX.2-klein-base-4B``: true CFG); it is written to ``model_index.json``
as diffusers writes it. The scheduler config is FLUX.2's (dynamic shifting; the pipeline
passes its own μ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.tiny_text import (
    qwen3_chat_tokenizer,
    tiny_qwen_text_config,
)
from unirl.models.common.tiny_vae import TinyKLVAE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen3Config

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 2  # 2: the chat template is common.tiny_text's

# FLUX.2's FlowMatchEulerDiscreteScheduler config (dynamic shifting; the pipeline computes μ
# itself from the image token count and the step count, so base / max shift are not read).
SCHEDULER_CONFIG: ConfigDict = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
    "time_shift_type": "exponential",
    "invert_sigmas": False,
    "stochastic_sampling": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}


@dataclass(kw_only=True, frozen=True)
class TinyFlux2Spec:
    """Sizes of the tiny stack (about 1 M parameters in all)."""

    seed: int = 0
    is_distilled: bool = True
    vocab_size: int = 1000
    # Qwen3 text encoder: thin, but deep enough for hidden states 9, 18, 27
    text_hidden: int = 32
    text_intermediate: int = 64
    text_layers: int = 28
    text_heads: int = 2
    text_kv_heads: int = 1
    text_head_dim: int = 16
    text_out_layers: int = 3  # how many hidden states the pipeline stacks
    # transformer (double-stream then single-stream blocks); rope axes sum to the head dim
    num_layers: int = 2
    num_single_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 32
    axes_dims_rope: tuple[int, int, int, int] = (8, 8, 8, 8)
    timestep_guidance_channels: int = 64
    # VAE (FLUX.2 latent format: 2x2 patches, batch-norm statistics per packed channel)
    latent_channels: int = 16
    vae_channels: int = 32
    vae_levels: int = 4
    bn_mean_range: float = 0.3
    bn_std_range: tuple[float, float] = (0.4, 1.0)
    # decoder shaping (see shape_tiny_decoder)
    decoder_anchor_channels: int = 8
    decoder_anchor_value: float = 20.0
    decoder_gain: float = 2.5
    decoder_residual_damping: float = 0.05

    @property
    def packed_channels(self) -> int:
        return 4 * self.latent_channels


# -- tokenizer -----------------------------------------------------------------------------------


def build_tiny_tokenizer(
    spec: TinyFlux2Spec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A ``Qwen2Tokenizer`` (byte-level BPE, Qwen3's special tokens and chat template) trained
    on the corpus wrapped in the chat turn with thinking off, as the pipeline renders it."""
    return qwen3_chat_tokenizer(
        enable_thinking=False,
        vocab_size=spec.vocab_size,
        model_max_length=2048,
        lines=lines,
    )


# -- model configs -------------------------------------------------------------------------------


def transformer_config(spec: TinyFlux2Spec) -> ConfigDict:
    return {
        "patch_size": 1,
        "in_channels": spec.packed_channels,
        "out_channels": None,
        "num_layers": spec.num_layers,
        "num_single_layers": spec.num_single_layers,
        "attention_head_dim": spec.attention_head_dim,
        "num_attention_heads": spec.num_attention_heads,
        "joint_attention_dim": spec.text_out_layers * spec.text_hidden,
        "timestep_guidance_channels": spec.timestep_guidance_channels,
        "mlp_ratio": 3.0,
        "axes_dims_rope": list(spec.axes_dims_rope),
        "rope_theta": 2000,
        "eps": 1e-6,
        "guidance_embeds": False,
    }


def vae_config(spec: TinyFlux2Spec) -> ConfigDict:
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ["DownEncoderBlock2D"] * spec.vae_levels,
        "up_block_types": ["UpDecoderBlock2D"] * spec.vae_levels,
        # equal widths: no conv shortcuts, so the decoder's residual path is an identity
        "block_out_channels": [spec.vae_channels] * spec.vae_levels,
        "layers_per_block": 1,
        "latent_channels": spec.latent_channels,
        # one group: GroupNorm normalises over all channels, which the anchor channels pin
        "norm_num_groups": 1,
        "sample_size": 1024,
        "use_quant_conv": False,
        "use_post_quant_conv": False,
        "mid_block_add_attention": True,
        "batch_norm_eps": 1e-4,
        "patch_size": [2, 2],
    }


def text_encoder_config(spec: TinyFlux2Spec, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    from transformers import Qwen3Config

    return Qwen3Config.from_dict(
        {
            **tiny_qwen_text_config(spec, tokenizer),
            "head_dim": spec.text_head_dim,
            "tie_word_embeddings": True,
        }
    )


# -- the VAE -------------------------------------------------------------------------------------


@torch.no_grad()
def set_batch_norm_statistics(vae: Any, spec: TinyFlux2Spec, generator: torch.Generator) -> None:
    """Non-trivial per-channel latent statistics (mean in ±``bn_mean_range``, std in
    ``bn_std_range``), so a wrong normalisation or channel order fails the tests."""
    c = spec.packed_channels
    lo, hi = spec.bn_std_range
    mean = (torch.rand(c, generator=generator) * 2 - 1) * spec.bn_mean_range
    std = lo + (hi - lo) * torch.rand(c, generator=generator)
    vae.bn.running_mean.copy_(mean)
    vae.bn.running_var.copy_(std**2 - vae.config.batch_norm_eps)


def unpatchify(z: torch.Tensor) -> torch.Tensor:
    """``[B, 4·C, h, w]`` (channel = ``c·4 + 2·dy + dx``) -> the VAE latent ``[B, C, 2h, 2w]``."""
    b, packed, h, w = z.shape
    z = z.reshape(b, packed // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return z.reshape(b, packed // 4, 2 * h, 2 * w)


def patchify(z: torch.Tensor) -> torch.Tensor:
    """The VAE latent ``[B, C, 2h, 2w]`` -> ``[B, 4·C, h, w]`` (inverse of :func:`unpatchify`)."""
    b, c, hh, ww = z.shape
    z = z.reshape(b, c, hh // 2, 2, ww // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return z.reshape(b, 4 * c, hh // 2, ww // 2)


@torch.no_grad()
def shape_tiny_decoder(vae: Any, spec: TinyFlux2Spec, generator: torch.Generator) -> None:
    """Make the random decoder a smooth, strongly responsive up-projection (the shared tiny
    shaping of the diffusers ``Decoder``, ``models/common/tiny_vae.py``), then centre every
    RGB channel on mid-grey over N(0, 1) model-space latents un-normalised with this VAE's
    batch-norm statistics."""
    shaping = TinyKLVAE.from_spec(spec, latent_sample_size=8, scaling_factor=1.0, shift_factor=0.0)
    shaping.shape_decoder(vae.decoder, generator)
    z = torch.randn(32, spec.packed_channels, 4, 4, generator=generator)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    out = vae.decoder(unpatchify(z * std + mean))
    vae.decoder.conv_out.bias.sub_(out.mean(dim=(0, 2, 3)))


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinyFlux2Spec) -> Any:
    """The tiny stack as an in-memory diffusers ``Flux2KleinPipeline`` (fp32, CPU, seeded)."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3ForCausalLM

    if spec.text_layers < 27 or sum(spec.axes_dims_rope) != spec.attention_head_dim:
        raise ValueError(
            "TinyFlux2Spec: text_layers must be >= 27 (the pipeline reads hidden state 27) and "
            "axes_dims_rope must sum to attention_head_dim"
        )
    tokenizer = build_tiny_tokenizer(spec)
    # One seed per component, so resizing one leaves the others' weights unchanged; the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = Flux2Transformer2DModel(**transformer_config(spec))
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKLFlux2(**vae_config(spec))
        set_batch_norm_statistics(vae, spec, torch.Generator().manual_seed(spec.seed + 6))
        shape_tiny_decoder(vae, spec, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        text_encoder = Qwen3ForCausalLM(text_encoder_config(spec, tokenizer))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=spec.is_distilled,
    )
