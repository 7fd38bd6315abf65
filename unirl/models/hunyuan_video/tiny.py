"""The ``tiny`` HunyuanVideo 1.5 stack: every component at toy size, built from configs, no
download.

Components are the real diffusers / transformers classes (``HunyuanVideo15Transformer3DModel``,
``AutoencoderKLHunyuanVideo15``, ``Qwen2_5_VLTextModel``, ``T5EncoderModel``, ``Qwen2Tokenizer``,
``ByT5Tokenizer``), so the saved folder is a valid ``HunyuanVideo15Pipeline`` layout; only
sizes and two initialisations are ours:

- the Qwen tokenizer is a byte-level BPE trained on the bundled corpus wrapped in the
  pipeline's chat turn (its system message, the prompt as the user turn, the assistant
  header), split with Qwen2's pre-tokenizer pattern; the build checks that the turn's prefix
  is exactly the pipeline's ``crop_start`` (108) tokens, as with the released tokenizer. The
  ByT5 tokenizer needs no vocabulary file (bytes);
- the VAE decoder is reshaped into a near-linear, smooth up-projection
  (:func:`shape_tiny_decoder`): a random decoder barely reacts to its latents, which would
  make pixel rewards unlearnable.

The scheduler is ``FlowMatchEulerDiscreteScheduler`` with the released 480p shift (5.0), the
guider ``ClassifierFreeGuidance`` at the released scale (6.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common.tiny import corpus_lines
from unirl.models.common_ar.tiny import CHATML_TEMPLATE, ENDOFTEXT, IM_END, IM_START

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen2_5_VLTextConfig, T5Config

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1

# Qwen2's pre-tokenizer split (contractions, letter runs with one leading non-letter, single
# digits, punctuation runs, newlines, other whitespace): with it, and every template word in
# the vocabulary, the system turn is as many tokens as the released tokenizer makes of it.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(kw_only=True, frozen=True)
class TinyHunyuanVideo15Spec:
    """Sizes of the tiny stack (transformer 4.7 M parameters, 4.2 M of them the ByT5
    projection's fixed 2048-wide hidden layer; VAE 7.9 M; text encoders 0.1 M)."""

    seed: int = 0
    vocab_size: int = 1000
    # Qwen2.5-VL text model (head dim 16: mrope sections sum to 8); the pipeline reads the
    # third-to-last hidden state, so three layers make it a contextual one
    text_hidden: int = 32
    text_intermediate: int = 64
    text_layers: int = 3
    text_heads: int = 2
    text_kv_heads: int = 1
    mrope_section: tuple[int, int, int] = (2, 3, 3)
    # ByT5 glyph encoder (a T5 encoder over the 384 byte ids)
    glyph_d_model: int = 24
    glyph_d_kv: int = 8
    glyph_d_ff: int = 48
    glyph_layers: int = 2
    glyph_heads: int = 3
    # transformer (dual-stream blocks, patch 1); rope axes sum to the head dim
    num_layers: int = 2
    num_refiner_layers: int = 1
    num_attention_heads: int = 2
    attention_head_dim: int = 32
    mlp_ratio: float = 4.0
    rope_axes_dim: tuple[int, int, int] = (8, 12, 12)
    image_embed_dim: int = 16
    target_size: int = 64
    # VAE (the released latent format: 32 channels, 16x spatial, 4x temporal, one scaling
    # factor); encoder channels per level, the decoder runs them reversed (128, 32, 16, 8, 8)
    latent_channels: int = 32
    vae_channels: tuple[int, ...] = (8, 8, 16, 32, 128)
    scaling_factor: float = 0.75  # not the released 1.03682, so a missing division shows
    # decoder shaping (see shape_tiny_decoder)
    decoder_signal_channels: int = 4
    decoder_anchor_value: float = 20.0
    decoder_activation_std: float = 0.15
    decoder_gain: float = 0.6
    decoder_temporal_gain: float = 10.0
    # scheduler and guider (the released 480p text-to-video settings)
    flow_shift: float = 5.0
    guidance_scale: float = 6.0

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


# -- tokenizers ----------------------------------------------------------------------------------


def chat_turn(prompt: str) -> str:
    """The text the pipeline's chat template renders for one prompt (system message, user
    turn, assistant header)."""
    from unirl.models.hunyuan_video.text_encode import pipeline_prompt_template

    system = pipeline_prompt_template().system_message
    return (
        f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{prompt}{IM_END}\n"
        f"{IM_START}assistant\n"
    )


def build_tiny_tokenizer(
    spec: TinyHunyuanVideo15Spec, lines: list[str] | None = None
) -> PreTrainedTokenizerBase:
    """A ``Qwen2Tokenizer`` (byte-level BPE over Qwen2's split) trained on the corpus wrapped
    in the chat turn, with the ChatML template; ``<|endoftext|>`` is pad (id 0). Raises when
    the turn's prefix is not the pipeline's ``crop_start`` tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    from unirl.models.hunyuan_video.text_encode import pipeline_prompt_template

    template = pipeline_prompt_template()
    lines = corpus_lines() if lines is None else lines
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([chat_turn(line) for line in lines], trainer)
    tokenizer = Qwen2Tokenizer(
        tokenizer_object=bpe,
        unk_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=template.max_sequence_length + template.crop_start,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    prefix = chat_turn("").split(f"{IM_END}\n{IM_START}assistant")[0]
    count = len(tokenizer(prefix).input_ids)
    if count != template.crop_start:
        raise ValueError(
            f"the tiny tokenizer splits the chat turn's prefix into {count} tokens, the "
            f"pipeline crops {template.crop_start}; grow TinyHunyuanVideo15Spec.vocab_size"
        )
    return tokenizer


def build_glyph_tokenizer() -> PreTrainedTokenizerBase:
    """ByT5's byte tokenizer (no vocabulary file): pad 0, ``</s>`` 1, unk 2, bytes from 3."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


# -- model configs -------------------------------------------------------------------------------


def transformer_config(spec: TinyHunyuanVideo15Spec) -> ConfigDict:
    return {
        "in_channels": 2 * spec.latent_channels + 1,  # noise, condition latents, mask
        "out_channels": spec.latent_channels,
        "num_attention_heads": spec.num_attention_heads,
        "attention_head_dim": spec.attention_head_dim,
        "num_layers": spec.num_layers,
        "num_refiner_layers": spec.num_refiner_layers,
        "mlp_ratio": spec.mlp_ratio,
        "patch_size": 1,
        "patch_size_t": 1,
        "qk_norm": "rms_norm",
        "text_embed_dim": spec.text_hidden,
        "text_embed_2_dim": spec.glyph_d_model,
        "image_embed_dim": spec.image_embed_dim,
        "rope_theta": 256.0,
        "rope_axes_dim": list(spec.rope_axes_dim),
        "target_size": spec.target_size,
        "task_type": "t2v",
        "use_meanflow": False,
    }


def vae_config(spec: TinyHunyuanVideo15Spec) -> ConfigDict:
    return {
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": spec.latent_channels,
        "block_out_channels": list(spec.vae_channels),
        "layers_per_block": 1,
        "spatial_compression_ratio": 16,
        "temporal_compression_ratio": 4,
        "downsample_match_channel": True,
        "upsample_match_channel": True,
        "scaling_factor": spec.scaling_factor,
    }


def scheduler_config(spec: TinyHunyuanVideo15Spec) -> ConfigDict:
    return {"num_train_timesteps": 1000, "shift": spec.flow_shift}


def text_encoder_config(
    spec: TinyHunyuanVideo15Spec, tokenizer: PreTrainedTokenizerBase
) -> Qwen2_5_VLTextConfig:
    from transformers import Qwen2_5_VLTextConfig

    return Qwen2_5_VLTextConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        max_position_embeddings=2048,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": list(spec.mrope_section),
        },
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def glyph_encoder_config(spec: TinyHunyuanVideo15Spec) -> T5Config:
    from transformers import T5Config

    return T5Config(
        vocab_size=384,  # ByT5: 3 specials, 256 bytes, 125 sentinels
        d_model=spec.glyph_d_model,
        d_kv=spec.glyph_d_kv,
        d_ff=spec.glyph_d_ff,
        num_layers=spec.glyph_layers,
        num_heads=spec.glyph_heads,
        feed_forward_proj="gated-gelu",  # as byt5-small
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )


# -- the decoder trap ----------------------------------------------------------------------------


def _upsample_layout(module: Any) -> tuple[int, int, int, bool]:
    """``(in_channels, out_channels, repeats, temporal)`` of a ``HunyuanVideo15Upsample``."""
    conv = module.conv.conv
    temporal = bool(module.add_temporal_upsample)
    factor = 8 if temporal else 4
    return conv.in_channels, conv.out_channels // factor, int(module.repeats), temporal


@torch.no_grad()
def shape_tiny_decoder(vae: Any, spec: TinyHunyuanVideo15Spec, generator: torch.Generator) -> None:
    """Turn a random ``AutoencoderKLHunyuanVideo15`` decoder into a smooth, strongly responsive
    one, every frame included.

    This decoder (DC-AE style) has shortcuts no weight switches off: ``conv_in`` adds the latent
    repeated over its channels, and every upsampler adds its input rearranged channels-to-space
    (the first frame of a temporal upsampler through another rearrangement than the others).
    The shaping works with them:

    - residual branches and the mid attention output are zero, so between ``conv_in`` and the
      output norm the decoder is linear: each ``conv_in`` and upsampler convolution cancels
      its block's shortcut and writes the layout it wants instead;
    - ``conv_in`` writes S *signal* channels (a random projection of the current latent frame)
      repeated with period S over all its channels; the temporal upsamplers copy them to the
      2x2 sub-pixels (nearest) and to both new frames (the first of the two is the mean of the
      previous frame and the current one), the spatial ones upsample bilinearly;
    - the first spatial upsampler's bias adds two *anchor* channels (±A) that dominate the
      output RMS norm, so it acts as a fixed scaling; the norm keeps only the signal (scaled
      so SiLU works near its linear range) and ``conv_out`` mixes it into RGB centred on grey.

    The first frame: a temporal upsampler's convolution is shared by all frames, but its
    shortcut reads the first frame's channels in another order than the later frames', so
    the cancellation is exact for the later frames only and the first frame keeps a fixed
    remapping of its signal channels. The period-S layout (S dividing ``in / 32``) makes that
    remapping the same at every sub-pixel, so the first frame is as smooth as the others; and
    each temporal upsampler reads the signal at 1/``decoder_temporal_gain`` of what it writes
    (``conv_in`` writes it at 1/gain²), so the leftover stays small. The first frame decodes
    latent frame 0 with another (fixed, linear) colour mix.
    """
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
        HunyuanVideo15AttnBlock,
        HunyuanVideo15ResnetBlock,
        HunyuanVideo15Upsample,
    )

    decoder = vae.decoder
    z_dim = spec.latent_channels
    signal = spec.decoder_signal_channels
    width0 = decoder.conv_in.conv.out_channels
    if width0 % 32 or width0 // 32 != signal:
        raise ValueError(
            f"TinyHunyuanVideo15Spec: the decoder's first width ({width0}) must be 32 x "
            f"decoder_signal_channels ({signal}): the first frame's shortcut keeps the layout "
            "only with a channel period of width / 32"
        )

    for module in decoder.modules():
        if isinstance(module, HunyuanVideo15ResnetBlock):
            module.conv2.conv.weight.zero_()
            module.conv2.conv.bias.zero_()
        elif isinstance(module, HunyuanVideo15AttnBlock):
            module.proj_out.weight.zero_()
            module.proj_out.bias.zero_()

    # conv_in: period-S signal copies, minus the latent repeated over the channels
    w_in = torch.zeros_like(decoder.conv_in.conv.weight)  # [width0, z, t=3, 3, 3]; t=2 is "now"
    projection = torch.randn(signal, z_dim, generator=generator) / math.sqrt(z_dim)
    repeat = width0 // z_dim
    for j in range(width0):
        w_in[j, :, 2, 1, 1] = projection[j % signal] / spec.decoder_temporal_gain**2
        w_in[j, j // repeat, 2, 1, 1] -= 1.0
    decoder.conv_in.conv.weight.copy_(w_in)
    decoder.conv_in.conv.bias.zero_()

    upsamplers = [m for m in decoder.modules() if isinstance(m, HunyuanVideo15Upsample)]
    spatial_seen = 0
    gain = spec.decoder_temporal_gain
    anchor_channels = (signal, signal + 1)
    for module in upsamplers:
        c_in, c_out, repeats, temporal = _upsample_layout(module)
        conv = module.conv.conv
        w = torch.zeros_like(conv.weight)  # [c_out * factor, c_in, 3, 3, 3]
        b = torch.zeros(conv.out_channels)
        if c_out < signal + 2:
            raise ValueError(
                f"TinyHunyuanVideo15Spec: an upsampler of {c_out} channels is too narrow"
            )
        if temporal:
            for g in range(8):  # g = 4·r1 + 2·dy + dx (frame, row, column of the new pixel)
                first_of_pair = g < 4
                for c in range(c_out):
                    k = g * c_out + c
                    w[k, g * c_in // 8 + c // repeats, 2, 1, 1] -= 1.0  # the later frames' shortcut
                    if c >= c_out // signal * signal:
                        continue
                    source = c % signal  # any copy: the input has period S
                    if first_of_pair:  # the mean of the previous frame and this one
                        w[k, source, 1, 1, 1] += 0.5 * gain
                        w[k, source, 2, 1, 1] += 0.5 * gain
                    else:
                        w[k, source, 2, 1, 1] += gain
        else:
            # the first spatial upsampler carries the signal and adds the anchors (its bias),
            # the second carries both
            first_spatial = spatial_seen == 0
            spatial_seen += 1
            carried = signal if first_spatial else signal + 2
            taps = {0: {-1: 0.25, 0: 0.75}, 1: {0: 0.75, 1: 0.25}}  # bilinear, per sub-pixel
            for s in range(4):
                dy, dx = divmod(s, 2)
                for c in range(c_out):
                    k = s * c_out + c
                    w[k, k // repeats, 2, 1, 1] -= 1.0  # the shortcut
                    if first_spatial and c in anchor_channels:
                        b[k] = spec.decoder_anchor_value * (1.0 if c == signal else -1.0)
                        continue
                    if c >= carried:
                        continue
                    for oy, wy in taps[dy].items():
                        for ox, wx in taps[dx].items():
                            w[k, c, 2, 1 + oy, 1 + ox] += wy * wx
        conv.weight.copy_(w)
        conv.bias.copy_(b)
    if spatial_seen != 2:
        raise ValueError(
            "TinyHunyuanVideo15Spec: the decoder must have two spatial-only upsamplers"
        )

    # After the output norm a signal channel is s·sqrt(width)/|x| ≈ s·sqrt(width)/(A·sqrt(2));
    # scale it to `decoder_activation_std` for unit-variance s, and drop every other channel.
    width = decoder.norm_out.gamma.shape[0]
    norm_scale = spec.decoder_anchor_value * math.sqrt(2 / width)
    gamma = torch.zeros_like(decoder.norm_out.gamma)
    gamma[:signal] = spec.decoder_activation_std * norm_scale
    decoder.norm_out.gamma.copy_(gamma)

    mix = torch.randn(3, signal, generator=generator) * (spec.decoder_gain / math.sqrt(signal))
    w_out = torch.zeros_like(decoder.conv_out.conv.weight)
    w_out[:, :signal, 2, 1, 1] = mix / spec.decoder_activation_std
    decoder.conv_out.conv.weight.copy_(w_out)
    decoder.conv_out.conv.bias.zero_()
    # Centre each RGB channel on mid-grey over N(0, 1) model-space latents (two latent frames).
    # (one video per call: the decoder's mid attention takes batches of one, see decode_videos)
    latents = torch.randn(4, z_dim, 2, 2, 3, generator=generator) / vae.config.scaling_factor
    out = torch.cat([decoder(z[None]) for z in latents])
    decoder.conv_out.conv.bias.copy_(-out.mean(dim=(0, 2, 3, 4)))


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinyHunyuanVideo15Spec) -> Any:
    """The tiny stack as an in-memory diffusers ``HunyuanVideo15Pipeline`` (fp32, CPU, seeded)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import Qwen2_5_VLTextModel, T5EncoderModel

    tokenizer = build_tiny_tokenizer(spec)
    # One seed per component, so resizing one leaves the others' weights unchanged; the
    # caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = HunyuanVideo15Transformer3DModel(**transformer_config(spec))
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKLHunyuanVideo15(**vae_config(spec))
        shape_tiny_decoder(vae, spec, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        text_encoder = Qwen2_5_VLTextModel(text_encoder_config(spec, tokenizer))
        torch.manual_seed(spec.seed + 4)
        text_encoder_2 = T5EncoderModel(glyph_encoder_config(spec))
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    return HunyuanVideo15Pipeline(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_config(spec)),
        text_encoder_2=text_encoder_2,
        tokenizer_2=build_glyph_tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=spec.guidance_scale),
    )


def write_tiny_hunyuan_video(folder: Path, spec: TinyHunyuanVideo15Spec) -> None:
    """Build the tiny stack and ``save_pretrained`` it (safetensors) into ``folder``."""
    pipe = build_tiny_pipeline(spec)
    with hf_progress_bars_disabled():
        pipe.save_pretrained(str(folder), safe_serialization=True)
