"""The ``tiny`` HunyuanVideo 1.0 stack: every component at toy size, built from configs, no
download.

Components are the real diffusers / transformers classes (``HunyuanVideoTransformer3DModel``,
``AutoencoderKLHunyuanVideo``, ``LlamaModel``, ``CLIPTextModel``), so the saved folder is a
valid ``HunyuanVideoPipeline`` layout; only sizes and three things are ours:

- the Llama tokenizer is a byte-level BPE trained on the bundled corpus wrapped in the
  pipeline's prompt template, split with Llama 3's pre-tokenizer pattern and prefixed with
  ``<|begin_of_text|>``; the build checks that the template's prefix is exactly the
  pipeline's ``crop_start`` (95) tokens, as with the released tokenizer, so the crop drops
  the system turn and nothing else;
- the CLIP tokenizer is a lower-casing byte-level BPE (``<|startoftext|> … <|endoftext|>``,
  77 tokens, padded with the end token);
- the VAE decoder is reshaped into a near-linear, smooth up-projection
  (:func:`shape_tiny_decoder`): a random decoder barely reacts to its latents, which would
  make pixel rewards unlearnable.

The scheduler is ``FlowMatchEulerDiscreteScheduler`` with the released shift (7.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.tiny import corpus_lines, save_pipeline, train_byte_level_bpe

if TYPE_CHECKING:
    from transformers import CLIPTextConfig, LlamaConfig, PreTrainedTokenizerBase

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1

# Llama 3's pre-tokenizer split (as Qwen2's, but digits in runs of up to three)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BEGIN_OF_TEXT, END_OF_TEXT = "<|begin_of_text|>", "<|end_of_text|>"
LLAMA_SPECIALS = (
    BEGIN_OF_TEXT,
    END_OF_TEXT,
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"


@dataclass(kw_only=True, frozen=True)
class TinyHunyuanVideoSpec:
    """Sizes of the tiny stack (transformer 0.2 M parameters, VAE 0.2 M, text encoders
    0.1 M)."""

    seed: int = 0
    vocab_size: int = 1000
    # Llama text encoder; the pipeline reads the third-to-last hidden state, so three layers
    # make it a contextual one
    text_hidden: int = 32
    text_intermediate: int = 64
    text_layers: int = 3
    text_heads: int = 2
    text_kv_heads: int = 1
    # CLIP text encoder (its pooled output is the transformer's pooled projection input)
    clip_hidden: int = 24
    clip_layers: int = 2
    clip_heads: int = 2
    clip_max_length: int = 77
    # transformer (dual-stream then single-stream blocks, 2x2 patches, guidance embedding);
    # rope axes sum to the head dim
    num_layers: int = 1
    num_single_layers: int = 1
    num_refiner_layers: int = 1
    num_attention_heads: int = 2
    attention_head_dim: int = 32
    mlp_ratio: float = 4.0
    rope_axes_dim: tuple[int, int, int] = (8, 12, 12)
    # VAE (the released latent format: 16 channels, 8x spatial, 4x temporal); equal widths at
    # every level and one norm group (see shape_tiny_decoder)
    latent_channels: int = 16
    vae_channels: int = 32
    vae_levels: int = 4
    scaling_factor: float = 0.75  # not the released 0.476986, so a missing division shows
    # decoder shaping
    decoder_anchor_channels: int = 16
    decoder_anchor_value: float = 20.0
    decoder_gain: float = 2.5
    decoder_residual_damping: float = 0.05
    # scheduler (the released shift)
    flow_shift: float = 7.0


# -- tokenizers ----------------------------------------------------------------------------------


def build_tiny_tokenizer(
    spec: TinyHunyuanVideoSpec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A Llama-3-style ``PreTrainedTokenizerFast`` (byte-level BPE over Llama 3's split, a
    ``<|begin_of_text|>`` prefix, padded with ``<|end_of_text|>``) trained on the corpus
    wrapped in the pipeline's template. Raises when the template's prefix is not the
    pipeline's ``crop_start`` tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from unirl.models.hunyuan_video_v1.text_encode import pipeline_prompt_template

    template = pipeline_prompt_template()
    lines = corpus_lines() if lines is None else lines
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(LLAMA_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([template.template.format(line) for line in lines], trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BEGIN_OF_TEXT} $A",
        pair=f"{BEGIN_OF_TEXT} $A {BEGIN_OF_TEXT} $B",
        special_tokens=[(BEGIN_OF_TEXT, bpe.token_to_id(BEGIN_OF_TEXT))],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BEGIN_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        model_max_length=template.max_sequence_length + template.crop_start,
    )
    prefix = template.template.split("{}")[0]
    count = len(tokenizer(prefix).input_ids)
    if count != template.crop_start:
        raise ValueError(
            f"the tiny tokenizer splits the template's prefix into {count} tokens, the "
            f"pipeline crops {template.crop_start}; change TinyHunyuanVideoSpec.vocab_size"
        )
    return tokenizer


def build_clip_tokenizer(
    spec: TinyHunyuanVideoSpec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A CLIP-style ``PreTrainedTokenizerFast``: lower-cased byte-level BPE,
    ``<|startoftext|> … <|endoftext|>``, padded with the end token, 77 tokens."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    lines = corpus_lines() if lines is None else lines
    clip = train_byte_level_bpe(lines, [CLIP_BOS, CLIP_EOS], spec.vocab_size, lowercase=True)
    bos, eos = clip.token_to_id(CLIP_BOS), clip.token_to_id(CLIP_EOS)
    clip.post_processor = processors.TemplateProcessing(
        single=f"{CLIP_BOS} $A {CLIP_EOS}",
        pair=f"{CLIP_BOS} $A {CLIP_EOS} $B {CLIP_EOS}",
        special_tokens=[(CLIP_BOS, bos), (CLIP_EOS, eos)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=clip,
        bos_token=CLIP_BOS,
        eos_token=CLIP_EOS,
        unk_token=CLIP_EOS,
        pad_token=CLIP_EOS,
        model_max_length=spec.clip_max_length,
    )


# -- model configs -------------------------------------------------------------------------------


def transformer_config(spec: TinyHunyuanVideoSpec) -> ConfigDict:
    return {
        "in_channels": spec.latent_channels,
        "out_channels": spec.latent_channels,
        "num_attention_heads": spec.num_attention_heads,
        "attention_head_dim": spec.attention_head_dim,
        "num_layers": spec.num_layers,
        "num_single_layers": spec.num_single_layers,
        "num_refiner_layers": spec.num_refiner_layers,
        "mlp_ratio": spec.mlp_ratio,
        "patch_size": 2,
        "patch_size_t": 1,
        "qk_norm": "rms_norm",
        "guidance_embeds": True,
        "text_embed_dim": spec.text_hidden,
        "pooled_projection_dim": spec.clip_hidden,
        "rope_theta": 256.0,
        "rope_axes_dim": list(spec.rope_axes_dim),
        "image_condition_type": None,
    }


def vae_config(spec: TinyHunyuanVideoSpec) -> ConfigDict:
    return {
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": spec.latent_channels,
        "down_block_types": ["HunyuanVideoDownBlock3D"] * spec.vae_levels,
        "up_block_types": ["HunyuanVideoUpBlock3D"] * spec.vae_levels,
        # equal widths: no conv shortcuts, so each residual path is an identity
        "block_out_channels": [spec.vae_channels] * spec.vae_levels,
        "layers_per_block": 1,
        # one group: GroupNorm normalises over all channels, which the anchor channels pin
        "norm_num_groups": 1,
        "scaling_factor": spec.scaling_factor,
        "spatial_compression_ratio": 8,
        "temporal_compression_ratio": 4,
        "mid_block_add_attention": True,
    }


def scheduler_config(spec: TinyHunyuanVideoSpec) -> ConfigDict:
    return {"num_train_timesteps": 1000, "shift": spec.flow_shift}


def text_encoder_config(
    spec: TinyHunyuanVideoSpec, tokenizer: PreTrainedTokenizerBase
) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        max_position_embeddings=1024,
        rope_theta=500000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def clip_config(spec: TinyHunyuanVideoSpec, tokenizer: PreTrainedTokenizerBase) -> CLIPTextConfig:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.clip_hidden,
        intermediate_size=spec.clip_hidden * 2,
        projection_dim=spec.clip_hidden,
        num_hidden_layers=spec.clip_layers,
        num_attention_heads=spec.clip_heads,
        max_position_embeddings=spec.clip_max_length,
        hidden_act="quick_gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # != 2: pooling takes the first end token
        pad_token_id=tokenizer.pad_token_id,
    )


# -- the decoder trap ----------------------------------------------------------------------------


@torch.no_grad()
def shape_tiny_decoder(vae: Any, spec: TinyHunyuanVideoSpec, generator: torch.Generator) -> None:
    """Turn a random ``AutoencoderKLHunyuanVideo`` decoder into a smooth, strongly responsive
    one (the same design as ``common.tiny_vae.TinyKLVAE``, in causal 3-D convolutions).

    Hidden channels split into *signal* and *anchor* channels. ``conv_in`` maps the current
    latent frame to the signal channels by a random 1x1 projection and writes constant ±A
    into the anchor channels; the anchors dominate every (single-group) GroupNorm, so the
    norms act as fixed affine maps. Residual branches are damped, the mid attention's output
    too; every upsampler's convolution (after diffusers' nearest x2 in space and, for the
    temporal ones, time) blurs each channel in space with a 3x3 binomial at the current frame
    only; the output norm puts SiLU in its near-linear range and ``conv_out`` mixes the signal
    into RGB centred on mid-grey over N(0, 1) model-space latents. ``post_quant_conv`` is the
    identity. Every pixel frame then shows a fixed linear image of its latent frame.
    """
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (
        HunyuanVideoResnetBlockCausal3D,
        HunyuanVideoUpsampleCausal3D,
    )

    decoder = vae.decoder
    channels, anchors = spec.vae_channels, spec.decoder_anchor_channels
    signal = channels - anchors
    if anchors < 2 or anchors % 2 or signal < 3:
        raise ValueError(
            f"TinyHunyuanVideoSpec: decoder_anchor_channels={anchors} must be even and >= 2, "
            f"leaving >= 3 of vae_channels={channels} for the signal"
        )
    z_dim = spec.latent_channels
    post = vae.post_quant_conv
    post.weight.copy_(torch.eye(z_dim).view(z_dim, z_dim, 1, 1, 1))
    post.bias.zero_()

    conv_in = decoder.conv_in.conv  # kernel [3, 3, 3]; causal: time tap 2 is the current frame
    w_in = torch.zeros_like(conv_in.weight)
    w_in[:signal, :, 2, 1, 1] = torch.randn(signal, z_dim, generator=generator) / math.sqrt(z_dim)
    conv_in.weight.copy_(w_in)
    b_in = torch.zeros(channels)
    b_in[signal:] = spec.decoder_anchor_value * torch.tensor([1.0, -1.0]).repeat(anchors // 2)
    conv_in.bias.copy_(b_in)

    blur = torch.tensor([1.0, 2.0, 1.0])
    blur = (blur[:, None] * blur[None, :]) / 16.0
    for module in decoder.modules():
        if isinstance(module, HunyuanVideoResnetBlockCausal3D):
            module.conv2.conv.weight.mul_(spec.decoder_residual_damping)
            module.conv2.conv.bias.zero_()
        elif isinstance(module, HunyuanVideoUpsampleCausal3D):
            w_up = torch.zeros_like(module.conv.conv.weight)
            for c in range(channels):
                w_up[c, c, 2] = blur
            module.conv.conv.weight.copy_(w_up)
            module.conv.conv.bias.zero_()
    for attn in decoder.mid_block.attentions:
        if attn is not None:
            attn.to_out[0].weight.mul_(spec.decoder_residual_damping)
            attn.to_out[0].bias.zero_()

    # Global std after conv_in is ~A·sqrt(anchors/channels); undo it for the signal channels,
    # scale to ~0.6 and bias by +1 so SiLU works in its monotone, near-linear range.
    norm_scale = spec.decoder_anchor_value * math.sqrt(anchors / channels)
    norm = decoder.conv_norm_out
    norm.weight.zero_()
    norm.weight[:signal] = 0.6 * norm_scale
    norm.bias.zero_()
    norm.bias[:signal] = 1.0

    mix = torch.randn(3, signal, generator=generator) * (spec.decoder_gain / math.sqrt(signal))
    conv_out = decoder.conv_out.conv
    w_out = torch.zeros_like(conv_out.weight)
    w_out[:, :signal, 2, 1, 1] = mix
    conv_out.weight.copy_(w_out)
    conv_out.bias.zero_()
    # Centre each RGB channel on mid-grey over N(0, 1) model-space latents (two latent frames).
    z = torch.randn(8, z_dim, 2, 4, 4, generator=generator) / spec.scaling_factor
    offset = decoder(post(z)).mean(dim=(0, 2, 3, 4))
    conv_out.bias.copy_(-offset)


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinyHunyuanVideoSpec) -> Any:
    """The tiny stack as an in-memory diffusers ``HunyuanVideoPipeline`` (fp32, CPU, seeded)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextModel, LlamaModel

    tokenizer = build_tiny_tokenizer(spec)
    tokenizer_2 = build_clip_tokenizer(spec)
    # One seed per component, so resizing one leaves the others' weights unchanged; the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = HunyuanVideoTransformer3DModel(**transformer_config(spec))
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKLHunyuanVideo(**vae_config(spec))
        shape_tiny_decoder(vae, spec, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        text_encoder = LlamaModel(text_encoder_config(spec, tokenizer))
        torch.manual_seed(spec.seed + 4)
        text_encoder_2 = CLIPTextModel(clip_config(spec, tokenizer_2))
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    return HunyuanVideoPipeline(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config(spec)),
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
    )


def write_tiny_hunyuan_video(folder: Path, spec: TinyHunyuanVideoSpec) -> None:
    """Build the tiny stack and ``save_pretrained`` it (safetensors) into ``folder``."""
    save_pipeline(build_tiny_pipeline(spec), folder)
