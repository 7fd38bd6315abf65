"""``flux2-klein-arch``: random weights at the released FLUX.2-Klein 4B shapes, for benchmarks.

Built in memory on the target device, in the target dtypes (never saved): speed does not
depend on the weights' values. Tokenizer: the tiny preset's locally trained BPE tokenizer with
its chat template (ids < 1000, valid in the real vocabulary); sequence lengths and every module
shape are the real ones. Like ``black-forest-labs/FLUX.2-klein-4B`` it is step-distilled (no
CFG).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from unirl.models.common.arch import ArchSpec, SingleEncoderArch
from unirl.models.common.config_dict import ConfigDict
from unirl.models.flux2.tiny import SCHEDULER_CONFIG

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(kw_only=True, frozen=True)
class Flux2KleinArchSpec(ArchSpec):
    """Configs of one architecture preset (plain dicts, as in the released ``config.json``)."""

    text_encoder: ConfigDict
    is_distilled: bool = True
    scheduler: ConfigDict = field(default_factory=lambda: dict(SCHEDULER_CONFIG))


def flux2_klein_arch_spec() -> Flux2KleinArchSpec:
    """The released ``FLUX.2-klein-4B`` component shapes: 5 double-stream + 20 single-stream
    blocks of 24 heads x 128 reading three stacked Qwen3-4B hidden states (3 x 2560), the
    32-channel FLUX.2 VAE (128 packed channels)."""
    return Flux2KleinArchSpec(
        name="flux2-klein-arch",
        transformer={
            "patch_size": 1,
            "in_channels": 128,
            "out_channels": None,
            "num_layers": 5,
            "num_single_layers": 20,
            "attention_head_dim": 128,
            "num_attention_heads": 24,
            "joint_attention_dim": 7680,
            "timestep_guidance_channels": 256,
            "mlp_ratio": 3.0,
            "axes_dims_rope": [32, 32, 32, 32],
            "rope_theta": 2000,
            "eps": 1e-6,
            "guidance_embeds": False,
        },
        vae={  # AutoencoderKLFlux2's defaults are the released VAE
            "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2,
            "latent_channels": 32,
            "norm_num_groups": 32,
            "use_quant_conv": True,
            "use_post_quant_conv": True,
            "batch_norm_eps": 1e-4,
            "patch_size": [2, 2],
        },
        text_encoder={  # Qwen3-4B
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
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": True,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
    )


ARCH_SPECS = {"flux2-klein-arch": flux2_klein_arch_spec}


def _transformer(spec: Flux2KleinArchSpec) -> torch.nn.Module:
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(**spec.transformer)


def _text_encoder(spec: Flux2KleinArchSpec, pad_token_id: int | None = None) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = dict(spec.text_encoder)
    if pad_token_id is not None:
        cfg["pad_token_id"] = pad_token_id
    return Qwen3ForCausalLM(Qwen3Config.from_dict(cfg))


def _vae(spec: Flux2KleinArchSpec) -> torch.nn.Module:
    from diffusers import AutoencoderKLFlux2

    return AutoencoderKLFlux2(**spec.vae)


def _tokenizer() -> PreTrainedTokenizerBase:
    from unirl.models.flux2.tiny import TinyFlux2Spec, build_tiny_tokenizer

    return build_tiny_tokenizer(TinyFlux2Spec())


ARCH = SingleEncoderArch(
    transformer=_transformer, vae=_vae, text_encoder=_text_encoder, tokenizer=_tokenizer
)
count_params = ARCH.count_params


def build_arch_modules(spec: Flux2KleinArchSpec, **build: Any) -> dict[str, Any]:
    """``ARCH.build``'s modules (``device``, ``dtype``, ``text_encoder_dtype``, ``vae_dtype``,
    ``seed``) and the spec's ``is_distilled``."""
    return {**ARCH.build(spec, **build), "is_distilled": spec.is_distilled}
