"""The ``tiny`` Wan stacks: every component at toy size, built from configs, no download.

Three variants share one builder (:class:`TinyWanSpec` ``variant``):

- ``t2v`` (preset ``tiny``): Wan 2.1 text-to-video, one transformer;
- ``two_expert`` (preset ``tiny-wan2.2``): Wan 2.2's layout, a high-noise ``transformer`` and a
  low-noise ``transformer_2`` switched at ``boundary_ratio``;
- ``i2v`` (preset ``tiny-i2v``): Wan 2.1 image-to-video, 36 input channels (noise, 4 mask
  channels, the VAE-encoded first frame) and a CLIP vision tower whose tokens enter every
  cross-attention through the added K/V projections.

Components are the real diffusers / transformers classes (``WanTransformer3DModel``,
``AutoencoderKLWan``, ``UMT5EncoderModel``, ``CLIPVisionModel``), so the saved folder is a valid
``WanPipeline`` / ``WanImageToVideoPipeline`` layout; only sizes and two initialisations are
ours: the tokenizer is a T5-style byte-level BPE trained on the bundled corpus (``<pad>`` 0,
``</s>`` 1 appended, ``<unk>`` 2), and the VAE decoder is reshaped into a smooth, responsive
up-projection (:func:`shape_tiny_decoder`) so pixel rewards can learn. The scheduler is
``FlowMatchEulerDiscreteScheduler`` with Wan's static shift (``flow_shift`` 3.0, 480p).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common.tiny import corpus_lines, train_byte_level_bpe
from unirl.models.common.tiny_causal_vae import CausalBlocks, TinyCausalDecoder

if TYPE_CHECKING:
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        PreTrainedTokenizerBase,
        UMT5Config,
    )

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1

T5_PAD, T5_EOS, T5_UNK = "<pad>", "</s>", "<unk>"
VARIANTS = ("t2v", "two_expert", "i2v")
# The Wan 2.1 I2V transformer splits its cross-attention context as ``[image tokens; the
# last 512 tokens]`` (a constant in diffusers' attention processor): I2V text is 512 tokens.
I2V_TEXT_TOKENS = 512


@dataclass(kw_only=True, frozen=True)
class TinyWanSpec:
    """Sizes of one tiny stack (a few hundred thousand parameters)."""

    variant: str = "t2v"
    seed: int = 0
    vocab_size: int = 1000
    # UMT5 text encoder
    text_d_model: int = 32
    text_d_kv: int = 16
    text_d_ff: int = 64
    text_layers: int = 2
    text_heads: int = 2
    # transformer: head dim 24 gives rope axes t/h/w of 8 each
    num_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 24
    ffn_dim: int = 96
    freq_dim: int = 32
    rope_max_seq_len: int = 64
    # VAE (Wan 2.1 latent format: 16 channels, 8x spatial, 4x temporal, per-channel mean / std)
    latent_channels: int = 16
    vae_base_dim: int = 16
    # decoder shaping (see shape_tiny_decoder)
    decoder_signal_channels: int = 6
    decoder_anchor_channels: int = 2
    decoder_anchor_value: float = 20.0
    decoder_activation_std: float = 0.35
    decoder_gain: float = 1.6
    decoder_residual_damping: float = 0.05
    # scheduler and experts
    flow_shift: float = 3.0
    boundary_ratio: float = 0.875
    # CLIP vision tower (i2v)
    image_size: int = 32
    image_patch: int = 8
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"TinyWanSpec.variant={self.variant!r} must be one of {VARIANTS}")

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


# -- tokenizer -----------------------------------------------------------------------------------


def build_tiny_tokenizer(
    spec: TinyWanSpec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A T5-style ``PreTrainedTokenizerFast`` trained on the corpus: ``… </s>``, pad ``<pad>`` = 0,
    eos ``</s>`` = 1, unk ``<unk>`` = 2 (the layout of the UMT5 tokenizer Wan ships)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    lines = corpus_lines() if lines is None else lines
    bpe = train_byte_level_bpe(lines, [T5_PAD, T5_EOS, T5_UNK], spec.vocab_size, lowercase=False)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"$A {T5_EOS}",
        pair=f"$A {T5_EOS} $B {T5_EOS}",
        special_tokens=[(T5_EOS, bpe.token_to_id(T5_EOS))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=T5_EOS,
        pad_token=T5_PAD,
        unk_token=T5_UNK,
        model_max_length=I2V_TEXT_TOKENS,
    )


# -- model configs -------------------------------------------------------------------------------


def text_encoder_config(spec: TinyWanSpec) -> UMT5Config:
    from transformers import UMT5Config

    return UMT5Config(
        vocab_size=spec.vocab_size,
        d_model=spec.text_d_model,
        d_kv=spec.text_d_kv,
        d_ff=spec.text_d_ff,
        num_layers=spec.text_layers,
        num_heads=spec.text_heads,
        feed_forward_proj="gated-gelu",  # as UMT5-XXL
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


def transformer_config(spec: TinyWanSpec) -> ConfigDict:
    i2v = spec.variant == "i2v"
    c = spec.latent_channels
    return {
        "patch_size": [1, 2, 2],
        "num_attention_heads": spec.num_attention_heads,
        "attention_head_dim": spec.attention_head_dim,
        "in_channels": 2 * c + 4 if i2v else c,  # noise, then the mask and the first frame
        "out_channels": c,
        "text_dim": spec.text_d_model,
        "freq_dim": spec.freq_dim,
        "ffn_dim": spec.ffn_dim,
        "num_layers": spec.num_layers,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": spec.vision_hidden if i2v else None,
        "added_kv_proj_dim": spec.inner_dim if i2v else None,
        "rope_max_seq_len": spec.rope_max_seq_len,
    }


def vae_config(spec: TinyWanSpec) -> ConfigDict:
    gen = torch.Generator().manual_seed(spec.seed + 6)
    z = spec.latent_channels
    # non-trivial per-channel statistics, so a wrong un-normalisation shows
    mean = (torch.rand(z, generator=gen) - 0.5).tolist()
    std = (0.5 + 1.5 * torch.rand(z, generator=gen)).tolist()
    return {
        "base_dim": spec.vae_base_dim,
        "z_dim": z,
        "dim_mult": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "dropout": 0.0,
        "latents_mean": [round(v, 4) for v in mean],
        "latents_std": [round(v, 4) for v in std],
    }


def scheduler_config(spec: TinyWanSpec) -> ConfigDict:
    """Wan's static shift on the Euler flow-matching scheduler (what ``WanPipeline`` takes)."""
    return {"num_train_timesteps": 1000, "shift": spec.flow_shift}


def vision_config(spec: TinyWanSpec) -> CLIPVisionConfig:
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(
        hidden_size=spec.vision_hidden,
        intermediate_size=2 * spec.vision_hidden,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        image_size=spec.image_size,
        patch_size=spec.image_patch,
        projection_dim=spec.vision_hidden,
    )


def image_processor(spec: TinyWanSpec) -> CLIPImageProcessor:
    """CLIP preprocessing at the tiny tower's resolution (resize, centre crop, CLIP mean / std)."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        size={"shortest_edge": spec.image_size},
        crop_size={"height": spec.image_size, "width": spec.image_size},
    )


# -- the decoder trap ----------------------------------------------------------------------------


def shape_tiny_decoder(vae: Any, spec: TinyWanSpec, generator: torch.Generator) -> None:
    """Make the random ``AutoencoderKLWan`` decoder a smooth, strongly responsive
    up-projection of the latent, frame by frame (``models/common/tiny_causal_vae.py``; video:
    the temporal upsamplers copy each frame into both new ones), centred over 8 latents of
    two frames of 4x4."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import (
        WanAttentionBlock,
        WanResample,
        WanResidualBlock,
    )

    blocks = CausalBlocks(WanResidualBlock, WanResample, WanAttentionBlock)
    TinyCausalDecoder.from_spec(spec).shape(
        vae, generator, blocks=blocks, temporal=True, centre_batch=(8, 2, 4, 4)
    )


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinyWanSpec) -> Any:
    """The tiny stack as an in-memory diffusers ``WanPipeline`` (or ``WanImageToVideoPipeline``
    for ``i2v``), fp32 on CPU, seeded."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import CLIPVisionModel, UMT5EncoderModel

    tokenizer = build_tiny_tokenizer(spec)
    # One seed per component, so resizing one leaves the others' weights unchanged; the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = WanTransformer3DModel(**transformer_config(spec))
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKLWan(**vae_config(spec))
        shape_tiny_decoder(vae, spec, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        text_encoder = UMT5EncoderModel(text_encoder_config(spec))
        transformer_2 = None
        if spec.variant == "two_expert":
            torch.manual_seed(spec.seed + 4)
            transformer_2 = WanTransformer3DModel(**transformer_config(spec))
        image_encoder = None
        if spec.variant == "i2v":
            torch.manual_seed(spec.seed + 5)
            image_encoder = CLIPVisionModel(vision_config(spec))
    modules = (transformer, transformer_2, vae, text_encoder, image_encoder)
    for module in modules:
        if module is not None:
            module.eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**scheduler_config(spec))
    if spec.variant == "i2v":
        return WanImageToVideoPipeline(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            scheduler=scheduler,
            image_processor=image_processor(spec),
            image_encoder=image_encoder,
            transformer=transformer,
        )
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=scheduler,
        transformer=transformer,
        transformer_2=transformer_2,
        boundary_ratio=spec.boundary_ratio if transformer_2 is not None else None,
    )


def write_tiny_wan(folder: Path, spec: TinyWanSpec) -> None:
    """Build the tiny stack and ``save_pretrained`` it (safetensors) into ``folder``."""
    pipe = build_tiny_pipeline(spec)
    with hf_progress_bars_disabled():
        pipe.save_pretrained(str(folder), safe_serialization=True)
