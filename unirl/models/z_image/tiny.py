"""The ``tiny`` Z-Image stack: every component at toy size, built from configs, no download.

Components are the real diffusers / transformers classes (``ZImageTransformer2DModel``,
``AutoencoderKL``, ``Qwen3Model``, ``Qwen2Tokenizer``), so the saved folder is a valid
``ZImagePipeline`` layout; only sizes and two initialisations are ours:

- the tokenizer is a byte-level BPE trained on the bundled corpus wrapped in the chat turn
  the pipeline renders (``<|im_start|>user ... <|im_end|> <|im_start|>assistant``), with
  Qwen's special tokens and our template that renders plain user turns the way the released
  Qwen3 template does (``common.tiny_text``, FLUX.2's too; ``enable_thinking=False`` adds the
  empty think block);
- the VAE is the FLUX-format ``AutoencoderKL`` (16 channels, scaling 0.3611, shift 0.1159)
  in the shared tiny layout with its decoder shaping (``unirl.models.common.tiny_vae``: the
  same class and the same ``z / scaling + shift`` un-normalisation as SD3's), because a
  random decoder barely reacts to its latents and pixel rewards would not learn.

The scheduler config is the released base model's (``Tongyi-MAI/Z-Image``: static shift 6).
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
TINY_BUILDER_VERSION = 1

# The released Tongyi-MAI/Z-Image scheduler (FlowMatchEulerDiscreteScheduler) config; the
# Turbo checkpoint's differs only in shift (3.0).
SCHEDULER_CONFIG: ConfigDict = {
    "num_train_timesteps": 1000,
    "use_dynamic_shifting": False,
    "shift": 6.0,
}


@dataclass(kw_only=True, frozen=True)
class TinyZImageSpec:
    """Sizes of the tiny stack (about 0.9 M parameters in all; the transformer's timestep MLP
    has a fixed 1024-wide hidden layer, 0.33 M of its 0.5 M)."""

    seed: int = 0
    vocab_size: int = 1000
    # Qwen3 text encoder (the pipeline reads the second-to-last hidden state)
    text_hidden: int = 32
    text_intermediate: int = 64
    text_layers: int = 2
    text_heads: int = 2
    text_kv_heads: int = 1
    text_head_dim: int = 16
    # transformer (single-stream DiT); rope axes sum to the head dim dim / n_heads
    dim: int = 64
    n_layers: int = 2
    n_refiner_layers: int = 1
    n_heads: int = 2
    axes_dims: tuple[int, int, int] = (8, 12, 12)
    axes_lens: tuple[int, int, int] = (1536, 512, 512)
    # VAE (FLUX latent format: 16 channels, scaling / shift factors)
    latent_channels: int = 16
    vae_channels: int = 32
    vae_levels: int = 4
    scaling_factor: float = 0.3611
    shift_factor: float = 0.1159
    # decoder shaping (common.tiny_vae, as SD3's; the gain is lower than SD3's because
    # 1/0.3611 amplifies latents 4x more than SD3's 1/1.5305)
    decoder_anchor_channels: int = 8
    decoder_anchor_value: float = 20.0
    decoder_gain: float = 0.6
    decoder_residual_damping: float = 0.05

    @property
    def latent_sample_size(self) -> int:
        """The latent side the decoder is centred on (64-pixel images)."""
        return 64 // 2 ** (self.vae_levels - 1)


# -- tokenizer -----------------------------------------------------------------------------------


def build_tiny_tokenizer(
    spec: TinyZImageSpec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A ``Qwen2Tokenizer`` (byte-level BPE, Qwen3's special tokens and chat template) trained
    on the corpus wrapped in the chat turn with thinking on, as the pipeline renders it."""
    return qwen3_chat_tokenizer(
        enable_thinking=True,
        vocab_size=spec.vocab_size,
        model_max_length=131072,
        lines=lines,
    )


# -- model configs -------------------------------------------------------------------------------


def transformer_config(spec: TinyZImageSpec) -> ConfigDict:
    return {
        "all_patch_size": [2],
        "all_f_patch_size": [1],
        "in_channels": spec.latent_channels,
        "dim": spec.dim,
        "n_layers": spec.n_layers,
        "n_refiner_layers": spec.n_refiner_layers,
        "n_heads": spec.n_heads,
        "n_kv_heads": spec.n_heads,
        "norm_eps": 1e-5,
        "qk_norm": True,
        "cap_feat_dim": spec.text_hidden,
        "rope_theta": 256.0,
        "t_scale": 1000.0,
        "axes_dims": list(spec.axes_dims),
        "axes_lens": list(spec.axes_lens),
    }


def tiny_vae(spec: TinyZImageSpec) -> TinyKLVAE:
    """The VAE part of ``spec``: a FLUX-format ``AutoencoderKL`` in the tiny layout (equal
    widths, one norm group) and its decoder shaping (``models/common/tiny_vae.py``)."""
    return TinyKLVAE.from_spec(spec)


def vae_config(spec: TinyZImageSpec) -> ConfigDict:
    return tiny_vae(spec).config()


def text_encoder_config(spec: TinyZImageSpec, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    from transformers import Qwen3Config

    return Qwen3Config.from_dict(
        {**tiny_qwen_text_config(spec, tokenizer), "head_dim": spec.text_head_dim}
    )


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinyZImageSpec) -> Any:
    """The tiny stack as an in-memory diffusers ``ZImagePipeline`` (fp32, CPU, seeded)."""
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    from diffusers.pipelines.z_image.pipeline_z_image import ZImagePipeline
    from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
        FlowMatchEulerDiscreteScheduler,
    )
    from transformers import Qwen3Model

    tokenizer = build_tiny_tokenizer(spec)
    # One seed per component, so resizing one leaves the others' weights unchanged; the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = ZImageTransformer2DModel(**transformer_config(spec))
        # diffusers initialises the pad tokens to zeros; random ones make a wrong padding show
        with torch.no_grad():
            transformer.x_pad_token.normal_()
            transformer.cap_pad_token.normal_()
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKL(**vae_config(spec))
        tiny_vae(spec).shape_decoder(vae.decoder, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        text_encoder = Qwen3Model(text_encoder_config(spec, tokenizer))
    for module in (transformer, vae, text_encoder):
        module.eval()
    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=text_encoder,
        # diffusers annotates this argument with the AutoTokenizer factory, not a tokenizer class
        tokenizer=tokenizer,  # type: ignore[arg-type]
        transformer=transformer,
    )
