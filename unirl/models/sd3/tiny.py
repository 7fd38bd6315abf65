"""The ``tiny`` SD3 stack: every component at toy size, built from configs, no download.

Components are the real diffusers / transformers classes (so the saved folder is a valid
``StableDiffusion3Pipeline`` layout); only their sizes and two initialisations are ours:

- tokenizers: byte-level BPE trained on the bundled corpus (``models/common/tiny_corpus.txt``),
  CLIP-style and T5-style;
- the VAE decoder is reshaped into a near-linear, smooth up-projection
  (:meth:`~unirl.models.common.tiny_vae.TinyKLVAE.shape_decoder`) because a randomly
  initialised decoder barely reacts to its latents, which would make pixel rewards
  (brightness, colour, JPEG size) unlearnable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.progress import hf_warnings_off
from unirl.models.common.tiny import corpus_lines, train_byte_level_bpe
from unirl.models.common.tiny_vae import TinyKLVAE

if TYPE_CHECKING:
    from transformers import CLIPTextConfig, T5Config

# Bump when the build code changes what it writes: it is part of the cache key.
TINY_BUILDER_VERSION = 1

CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"
T5_PAD, T5_EOS, T5_UNK = "<pad>", "</s>", "<unk>"


@dataclass(kw_only=True, frozen=True)
class TinySD3Spec:
    """Sizes of the tiny stack. CLIP-L and CLIP-G get different widths on purpose, so a
    swapped concat order or a missing pad to the T5 width fails a shape check."""

    seed: int = 0
    vocab_size: int = 1000
    # text encoders
    clip_l_hidden: int = 32
    clip_l_projection: int = 32
    clip_g_hidden: int = 48
    clip_g_projection: int = 48
    clip_layers: int = 2
    clip_heads: int = 2
    clip_max_length: int = 77
    t5_d_model: int = 96
    t5_d_ff: int = 192
    t5_layers: int = 2
    t5_heads: int = 2
    t5_d_kv: int = 32
    t5_model_max_length: int = 512
    # transformer (MMDiT); dual attention in block 0 exercises the SD3.5 path
    sample_size: int = 8
    patch_size: int = 2
    num_layers: int = 2
    num_attention_heads: int = 2
    attention_head_dim: int = 32
    dual_attention_layers: tuple[int, ...] = (0,)
    pos_embed_max_size: int = 32
    # VAE (SD3 latent format: 16 channels, SD3 scaling / shift)
    latent_channels: int = 16
    vae_channels: int = 32
    vae_levels: int = 4
    scaling_factor: float = 1.5305
    shift_factor: float = 0.0609
    # decoder shaping (common.tiny_vae.TinyKLVAE.shape_decoder)
    decoder_anchor_channels: int = 8
    decoder_anchor_value: float = 20.0
    decoder_gain: float = 2.5
    decoder_residual_damping: float = 0.05
    # scheduler
    shift: float = 3.0

    @property
    def joint_attention_dim(self) -> int:
        return self.t5_d_model

    @property
    def pooled_projection_dim(self) -> int:
        return self.clip_l_projection + self.clip_g_projection


# -- tokenizers ----------------------------------------------------------------------------------


def build_tiny_tokenizers(
    spec: TinySD3Spec, lines: list[str] | None = None
) -> tuple[Any, Any, Any]:
    """``(clip_l, clip_g, t5)`` ``PreTrainedTokenizerFast`` trained on the corpus.

    CLIP-style: ``<|startoftext|> … <|endoftext|>``, max length 77; CLIP-L pads with the end
    token and CLIP-G with ``!`` (as the released SD3 tokenizers do). T5-style: ``… </s>``,
    pad ``<pad>`` = 0, eos ``</s>`` = 1.
    """
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
    common = {"bos_token": CLIP_BOS, "eos_token": CLIP_EOS, "unk_token": CLIP_EOS}
    clip_l = PreTrainedTokenizerFast(
        tokenizer_object=clip, pad_token=CLIP_EOS, model_max_length=spec.clip_max_length, **common
    )
    clip_g = PreTrainedTokenizerFast(
        tokenizer_object=clip.from_str(clip.to_str()),
        pad_token="!",
        model_max_length=spec.clip_max_length,
        **common,
    )

    t5 = train_byte_level_bpe(lines, [T5_PAD, T5_EOS, T5_UNK], spec.vocab_size, lowercase=False)
    t5.post_processor = processors.TemplateProcessing(
        single=f"$A {T5_EOS}",
        pair=f"$A {T5_EOS} $B {T5_EOS}",
        special_tokens=[(T5_EOS, t5.token_to_id(T5_EOS))],
    )
    t5_tok = PreTrainedTokenizerFast(
        tokenizer_object=t5,
        eos_token=T5_EOS,
        pad_token=T5_PAD,
        unk_token=T5_UNK,
        model_max_length=spec.t5_model_max_length,
    )
    return clip_l, clip_g, t5_tok


# -- model configs -------------------------------------------------------------------------------


def transformer_config(spec: TinySD3Spec) -> ConfigDict:
    inner = spec.num_attention_heads * spec.attention_head_dim
    return {
        "sample_size": spec.sample_size,
        "patch_size": spec.patch_size,
        "in_channels": spec.latent_channels,
        "out_channels": spec.latent_channels,
        "num_layers": spec.num_layers,
        "attention_head_dim": spec.attention_head_dim,
        "num_attention_heads": spec.num_attention_heads,
        "joint_attention_dim": spec.joint_attention_dim,
        "caption_projection_dim": inner,
        "pooled_projection_dim": spec.pooled_projection_dim,
        "pos_embed_max_size": spec.pos_embed_max_size,
        "dual_attention_layers": tuple(spec.dual_attention_layers),
        "qk_norm": "rms_norm",
    }


def tiny_vae(spec: TinySD3Spec) -> TinyKLVAE:
    """The VAE part of ``spec`` (config and decoder shaping, ``models/common/tiny_vae.py``)."""
    return TinyKLVAE.from_spec(spec, latent_sample_size=spec.sample_size)


def vae_config(spec: TinySD3Spec) -> ConfigDict:
    return tiny_vae(spec).config()


def clip_config(
    spec: TinySD3Spec, *, hidden: int, projection: int, act: str, bos: int, eos: int, pad: int
) -> CLIPTextConfig:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=spec.vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        projection_dim=projection,
        num_hidden_layers=spec.clip_layers,
        num_attention_heads=spec.clip_heads,
        max_position_embeddings=spec.clip_max_length,
        hidden_act=act,
        bos_token_id=bos,
        eos_token_id=eos,  # != 2, so pooling takes the first end token (pad may equal eos)
        pad_token_id=pad,
    )


def t5_config(spec: TinySD3Spec) -> T5Config:
    from transformers import T5Config

    return T5Config(
        vocab_size=spec.vocab_size,
        d_model=spec.t5_d_model,
        d_kv=spec.t5_d_kv,
        d_ff=spec.t5_d_ff,
        num_layers=spec.t5_layers,
        num_heads=spec.t5_heads,
        feed_forward_proj="gated-gelu",  # T5 v1.1, as T5-XXL
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    )


def scheduler_config(spec: TinySD3Spec) -> ConfigDict:
    return {"num_train_timesteps": 1000, "shift": spec.shift}


# -- build ---------------------------------------------------------------------------------------


def build_tiny_pipeline(spec: TinySD3Spec) -> Any:
    """The tiny stack as an in-memory ``StableDiffusion3Pipeline`` (fp32, CPU, seeded)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    with hf_warnings_off():  # the pipeline's import warns about torchvision, unrelated here
        from diffusers import StableDiffusion3Pipeline

    tok_l, tok_g, tok_t5 = build_tiny_tokenizers(spec)
    bos, eos = tok_l.bos_token_id, tok_l.eos_token_id

    # One seed per component, so resizing one component leaves the others' weights unchanged;
    # the caller's RNG state is restored afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        transformer = SD3Transformer2DModel(**transformer_config(spec))
        torch.manual_seed(spec.seed + 1)
        vae = AutoencoderKL(**vae_config(spec))
        tiny_vae(spec).shape_decoder(vae.decoder, torch.Generator().manual_seed(spec.seed + 2))
        torch.manual_seed(spec.seed + 3)
        clip_l = CLIPTextModelWithProjection(
            clip_config(
                spec,
                hidden=spec.clip_l_hidden,
                projection=spec.clip_l_projection,
                act="quick_gelu",
                bos=bos,
                eos=eos,
                pad=tok_l.pad_token_id,
            )
        )
        torch.manual_seed(spec.seed + 4)
        clip_g = CLIPTextModelWithProjection(
            clip_config(
                spec,
                hidden=spec.clip_g_hidden,
                projection=spec.clip_g_projection,
                act="gelu",
                bos=bos,
                eos=eos,
                pad=tok_g.pad_token_id,
            )
        )
        torch.manual_seed(spec.seed + 5)
        t5 = T5EncoderModel(t5_config(spec))
    scheduler = FlowMatchEulerDiscreteScheduler(**scheduler_config(spec))
    for module in (transformer, vae, clip_l, clip_g, t5):
        module.eval()
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip_l,
        tokenizer=tok_l,
        text_encoder_2=clip_g,
        tokenizer_2=tok_g,
        text_encoder_3=t5,
        tokenizer_3=tok_t5,
    )
