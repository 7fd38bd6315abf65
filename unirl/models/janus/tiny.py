"""The ``tiny`` Janus: a real ``JanusForConditionalGeneration`` at toy size (random init,
seeded) with a ChatML tokenizer trained locally, saved as a transformers folder. No download;
about 3.9M parameters, 3.8M of them the VQ model; seconds to build.

Every part of the real model is there at toy width: the LLaMA decoder (2 layers, hidden 64,
grouped-query attention), the SigLIP vision tower and its aligner (understanding), the VQ
tokenizer's decoder, the generation embeddings, aligner and head (image tokens). A 32 px image
is 4 x 4 = 16 image tokens from a 64-code book, each token an 8 x 8 pixel block.

The VQ decoder is *shaped* (:func:`shape_vq_decoder`) so that pixel rewards are learnable: a
random one decodes every code to nearly the same brightness (0.45-0.47 over 64 random images),
since each of its GroupNorms (32 groups, hard-coded) erases the mean of its group. Shaped,
the 64 codes repeated over a whole image span brightness 0.06-0.97, and 64 random images
0.29-0.60.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common_ar.tiny import CHATML_TEMPLATE, build_chat_tokenizer

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 2

BOS, BOI, EOI, IMAGE_PLACEHOLDER = (
    "<|begin_of_sentence|>",
    "<begin_of_image>",
    "<end_of_image>",
    "<image_placeholder>",
)
JANUS_SPECIALS = (BOS, BOI, EOI, IMAGE_PLACEHOLDER)


@dataclass(kw_only=True, frozen=True)
class TinyJanusSpec:
    """Sizes of the tiny model (see the module docstring)."""

    seed: int = 0
    vocab_size: int = 384
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    vision_hidden_size: int = 32
    image_size: int = 32
    patch_size: int = 8
    codebook_size: int = 64
    vq_base_channels: int = 128
    anchor_value: float = 10.0
    residual_damping: float = 0.05
    decoder_gain: float = 1.5


def tiny_tokenizer(spec: TinyJanusSpec) -> Any:
    """The ChatML tokenizer with Janus's specials; its chat template starts with BOS (the
    unconditional branch of image generation keeps BOS and ``<begin_of_image>`` only)."""
    tokenizer = build_chat_tokenizer(
        spec.vocab_size,
        extra_specials=JANUS_SPECIALS,
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.bos_token = BOS
    tokenizer.chat_template = "{{ bos_token }}" + CHATML_TEMPLATE
    return tokenizer


def model_config(spec: TinyJanusSpec, tokenizer: Any) -> dict[str, Any]:
    """The transformers ``JanusConfig`` (as a dict) of the tiny model."""
    grid = spec.image_size // spec.patch_size
    ids = tokenizer.convert_tokens_to_ids
    return {
        "text_config": {
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_hidden_layers,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "max_position_embeddings": spec.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
            "bos_token_id": ids(BOS),
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        "vision_config": {
            "hidden_size": spec.vision_hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": spec.image_size,
            "patch_size": spec.patch_size,
            "projection_dim": spec.hidden_size,
            "depth": 2,
            "num_image_tokens": grid * grid,
        },
        "vq_config": {
            "embed_dim": 8,
            "num_embeddings": spec.codebook_size,
            "latent_channels": spec.vq_base_channels,
            "base_channels": spec.vq_base_channels,
            # 3 upsamplings: a 4 x 4 token grid decodes to 32 x 32 pixels
            "channel_multiplier": [1, 1, 1, 1],
            "num_res_blocks": 0,
            "projection_dim": spec.hidden_size,
            "image_token_embed_dim": spec.hidden_size,
            "num_hidden_layers": 2,
        },
        "image_token_id": ids(IMAGE_PLACEHOLDER),
        "tie_word_embeddings": False,
    }


def generation_config(tokenizer: Any) -> Any:
    """What transformers' ``generate`` reads: eos / pad / bos, and ``boi_token_id`` (its image
    mode's unconditional branch keeps BOS and ``<begin_of_image>``)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        generation_kwargs={"boi_token_id": tokenizer.convert_tokens_to_ids(BOI)},
    )


@torch.no_grad()
def shape_vq_decoder(vq: Any, spec: TinyJanusSpec, generator: torch.Generator) -> None:
    """Turn the random VQ decoder into a smooth, strongly responsive one (the tiny diffusion
    VAEs' shaping, ``unirl.models.common.tiny_vae``, per GroupNorm group).

    Channels come in fours, one four per GroupNorm group (128 channels, 32 groups): two *signal*
    channels and two *anchor* channels that ``conv_in`` fills with the constants ``+A`` and
    ``-A`` (``anchor_value``). The anchors dominate their group's statistics (mean ~0, std
    ~A/sqrt(2)), so every normalisation acts as a nearly fixed affine map of the signal instead of
    erasing it (with two channels per group, or without anchors, a constant code would
    normalise to the same values whatever it is). ``post_quant_conv`` projects each (unit-norm) code onto
    the signal channels at random; residual branches (resnets, attention) are damped; the
    upsamplers copy each channel (nearest x2); the last norm undoes the anchor scaling and puts
    SiLU in its near-linear range; ``conv_out`` mixes the signal channels into RGB around
    mid-grey. Each token then decodes to its own 8 x 8 block whose colour and brightness are a
    smooth function of the code.
    """
    from transformers.models.janus.modeling_janus import (
        JanusVQVAEAttnBlock,
        JanusVQVAEConvUpsample,
        JanusVQVAEResnetBlock,
    )

    decoder = vq.decoder
    channels = decoder.conv_in.out_channels
    index = torch.arange(channels)
    signal = index[index % 4 < 2]
    plus, minus = index[index % 4 == 2], index[index % 4 == 3]
    embed = vq.post_quant_conv.in_channels
    w = torch.zeros_like(vq.post_quant_conv.weight)
    w[signal, :, 0, 0] = torch.randn(len(signal), embed, generator=generator)
    vq.post_quant_conv.weight.copy_(w)
    vq.post_quant_conv.bias.zero_()
    w = torch.zeros_like(decoder.conv_in.weight)
    w[signal, signal, 1, 1] = 1.0
    decoder.conv_in.weight.copy_(w)
    decoder.conv_in.bias.zero_()
    decoder.conv_in.bias[plus] = spec.anchor_value
    decoder.conv_in.bias[minus] = -spec.anchor_value
    for module in decoder.modules():
        if isinstance(module, JanusVQVAEResnetBlock):
            module.conv2.weight.mul_(spec.residual_damping)
            module.conv2.bias.zero_()
        elif isinstance(module, JanusVQVAEAttnBlock):
            module.proj_out.weight.mul_(spec.residual_damping)
            module.proj_out.bias.zero_()
        elif isinstance(module, JanusVQVAEConvUpsample):
            w = torch.zeros_like(module.conv.weight)
            w[torch.arange(channels), torch.arange(channels), 1, 1] = 1.0
            module.conv.weight.copy_(w)
            module.conv.bias.zero_()
    # in a group {s1, s2, +A, -A}: normalised s ~ (s - mean) / (A/sqrt(2)); undo it to 0.6·s + 1
    decoder.norm_out.weight.zero_()
    decoder.norm_out.bias.zero_()
    decoder.norm_out.weight[signal] = 0.6 * spec.anchor_value / 2**0.5
    decoder.norm_out.bias[signal] = 1.0
    mix = torch.randn(3, len(signal), generator=generator) * (
        spec.decoder_gain / len(signal) ** 0.5
    )
    w = torch.zeros_like(decoder.conv_out.weight)
    w[:, signal, 1, 1] = mix
    decoder.conv_out.weight.copy_(w)
    # SiLU(1) = 0.731: a code at the mean of the signal decodes to mid-grey
    decoder.conv_out.bias.copy_(-mix.sum(dim=1) * 0.731)


def write_tiny_janus(folder: Path, spec: TinyJanusSpec) -> None:
    """Build the tiny model and tokenizer and ``save_pretrained`` both into ``folder``."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    tokenizer = tiny_tokenizer(spec)
    config = JanusConfig.from_dict(model_config(spec, tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = JanusForConditionalGeneration(config)
        shape_vq_decoder(model.model.vqmodel, spec, torch.Generator().manual_seed(spec.seed + 1))
    model.generation_config = generation_config(tokenizer)
    with hf_progress_bars_disabled():
        model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
