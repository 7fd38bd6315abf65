"""``SD3Bundle``: the SD3 / SD3.5 modules (trainable MMDiT + frozen VAE and text encoders)
and SD3's own part of the family contract: loading, prompt encoding, the velocity call,
latent geometry and decode. The rest (config, devices, offload, dedupe, chunked decode,
checks) is :class:`~unirl.models.common.bundle.FlowMatchingBundle`'s."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import torch

from unirl.config.require import require
from unirl.models.common.arch import model_from_config
from unirl.models.common.bundle import FlowMatchingBundle, require_size_multiple
from unirl.models.common.config_dict import ConfigDict, config_int
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.folders import load_parts, read_diffusers_folder
from unirl.models.common.geometry import VAELatentGeometry, sigma_per_sample
from unirl.models.sd3.arch import build_arch_modules
from unirl.models.sd3.attention import install_fused_attention
from unirl.models.sd3.conditions import SD3Conditions
from unirl.models.sd3.config import SD3BundleConfig
from unirl.models.sd3.engine_maps import SD3EngineMaps
from unirl.models.sd3.presets import architecture_configs, resolve_model_source
from unirl.models.sd3.text_encode import SD3TextStack, encode_sd3_prompts, sd3_encoder_states


def _read_folder(folder: Path, bundle: SD3Bundle) -> dict[str, Any]:
    """Components of a diffusers SD3 folder (``save_pretrained`` layout), on CPU, cast; T5
    and its tokenizer are None with ``skip_t5``."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    t5 = not bundle.config.skip_t5
    parts = read_diffusers_folder(
        folder,
        bundle,
        transformer=SD3Transformer2DModel,
        vae=AutoencoderKL,
        text_encoders={
            "text_encoder": CLIPTextModelWithProjection,
            "text_encoder_2": CLIPTextModelWithProjection,
            **({"text_encoder_3": T5EncoderModel} if t5 else {}),
        },
        tokenizers=("tokenizer", "tokenizer_2", *(("tokenizer_3",) if t5 else ())),
    )
    return {"text_encoder_3": None, "tokenizer_3": None, **parts}


class SD3Bundle(VAELatentGeometry, FlowMatchingBundle):
    """SD3 / SD3.5 weights for rollout and training.

    Keyword arguments are the fields of :class:`SD3BundleConfig` (so a recipe block
    ``{_target_: unirl.models.sd3.SD3Bundle, path: tiny, dtype: bf16}`` builds it);
    ``SD3Bundle.from_config(config)`` takes a config whole. ``self.transformer`` is the
    trainable module; wrappers (peft, FSDP) may replace the attribute and every method goes
    through it.
    """

    config_class: ClassVar[type[SD3BundleConfig]] = SD3BundleConfig
    config: SD3BundleConfig
    frozen_module_names: ClassVar[tuple[str, ...]] = (
        "text_encoder",
        "text_encoder_2",
        "text_encoder_3",
        "vae",
    )
    block_class_names: ClassVar[tuple[str, ...]] = ("JointTransformerBlock",)
    lora_default_targets: ClassVar[tuple[str, ...]] = (
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
    )
    engine_maps: ClassVar[EngineMaps | None] = SD3EngineMaps()

    # -- checks before anything is built ----------------------------------------------------

    @classmethod
    def architecture(cls, path: str) -> tuple[dict, dict] | None:
        return architecture_configs(path)

    @classmethod
    def check_image_size(cls, architecture: tuple[dict, dict], key: str, size: int) -> None:
        transformer, vae = architecture
        patch = int(transformer.get("patch_size", 2))
        multiple = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1) * patch
        require_size_multiple(key, size, multiple, "VAE factor x patch size of this SD3 model")
        max_patches = transformer.get("pos_embed_max_size")
        if max_patches is not None:
            largest = int(max_patches) * multiple
            require(
                size <= largest,
                f"sampling.{key}={size} is larger than this model's position embedding allows "
                f"(pos_embed_max_size={max_patches} patches, at most {largest} pixels)",
            )

    @classmethod
    def trainable_from_architecture(cls, architecture: tuple[dict, dict]) -> torch.nn.Module:
        from diffusers import SD3Transformer2DModel

        return model_from_config(SD3Transformer2DModel, architecture[0])

    # -- modules -------------------------------------------------------------------------------

    def load(self) -> None:
        cfg = self.config
        require(
            not cfg.graph_text_encoders or self.device.type == "cuda",
            f"bundle.graph_text_encoders=true needs a CUDA device; this bundle runs on "
            f"{self.device}: set it false",
        )
        self.source = resolve_model_source(cfg.path)
        parts = load_parts(
            self,
            self.source,
            build_arch=functools.partial(build_arch_modules, build_t5=not cfg.skip_t5),
            read_folder=_read_folder,
        )

        self.transformer: torch.nn.Module = parts["transformer"]
        self.vae: torch.nn.Module = parts["vae"]
        self.text_encoder: torch.nn.Module = parts["text_encoder"]
        self.text_encoder_2: torch.nn.Module = parts["text_encoder_2"]
        self.text_encoder_3: torch.nn.Module | None = (
            parts["text_encoder_3"] if not cfg.skip_t5 else None
        )
        self.tokenizer = parts["tokenizer"]
        self.tokenizer_2 = parts["tokenizer_2"]
        self.tokenizer_3 = parts["tokenizer_3"]
        self.scheduler_config: ConfigDict = dict(parts["scheduler_config"])

        # Read geometry once, before anyone wraps the transformer.
        tcfg = self.transformer.config
        self.latent_channels = int(tcfg.in_channels)
        self.patch_size = int(tcfg.patch_size)
        self.joint_attention_dim = int(tcfg.joint_attention_dim)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.scaling_factor = float(self.vae.config.scaling_factor)
        self.shift_factor = float(self.vae.config.shift_factor or 0.0)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)
        if cfg.fuse_projections:
            install_fused_attention(self.transformer)

    # -- encode --------------------------------------------------------------------------------

    def _text_stack(self) -> SD3TextStack:
        return SD3TextStack(
            tokenizer=self.tokenizer,
            tokenizer_2=self.tokenizer_2,
            tokenizer_3=self.tokenizer_3,
            text_encoder=self.text_encoder,
            text_encoder_2=self.text_encoder_2,
            text_encoder_3=self.text_encoder_3,
            joint_attention_dim=self.joint_attention_dim,
        )

    def encode_unique(self, texts: list[str]) -> SD3Conditions:
        stack = self._text_stack()
        encoders = None
        if self.config.graph_text_encoders:
            encoders = self.graphed(
                "text_encoders",
                functools.partial(sd3_encoder_states, stack),
                "bundle.graph_text_encoders",
            )
        embeds, pooled = encode_sd3_prompts(
            stack,
            texts,
            max_sequence_length=self.config.max_sequence_length,
            t5_placeholder=self.config.t5_placeholder,
            encoders=encoders,
        )
        return SD3Conditions(
            prompt_embeds=embeds.to(self.device), pooled_prompt_embeds=pooled.to(self.device)
        )

    def with_negative(self, conditions: SD3Conditions, negative: SD3Conditions) -> SD3Conditions:  # type: ignore[override]
        n = len(conditions)
        return SD3Conditions(
            prompt_embeds=conditions.prompt_embeds,
            pooled_prompt_embeds=conditions.pooled_prompt_embeds,
            negative_prompt_embeds=negative.prompt_embeds.expand(n, -1, -1),
            negative_pooled_prompt_embeds=negative.pooled_prompt_embeds.expand(n, -1),
        )

    def cfg_conditions(self, conditions: SD3Conditions) -> SD3Conditions:
        """``[negative rows; prompt rows]`` (2·N) for one batched CFG forward."""
        return conditions.cfg_pairs()

    # -- velocity ------------------------------------------------------------------------------

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor | float, conditions: SD3Conditions
    ) -> torch.Tensor:
        """``v[B, C, h, w]`` (fp32) for ``latents[B, C, h, w]`` at noise level ``sigma`` (``[B]`` or scalar).

        The transformer sees ``timestep = sigma · num_train_timesteps`` as diffusers passes it
        and runs in the bundle's ``dtype``; ``conditions`` must have ``B`` rows.
        """
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=latents.device)
        timestep = (sigma_t * self.num_train_timesteps).to(self.device)
        with self.sdpa_context(), self.autocast():
            v = self.transformer(
                hidden_states=latents.to(self.device, self.dtype),
                encoder_hidden_states=conditions.prompt_embeds.to(self.device, self.dtype),
                pooled_projections=conditions.pooled_prompt_embeds.to(self.device, self.dtype),
                timestep=timestep,
                return_dict=False,
            )[0]
        return v.float()

    # -- geometry and decode ------------------------------------------------------------------

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Unscales as diffusers does (``latents / scaling_factor + shift_factor``) and
        decodes; ``pixels[B, 3, H, W]`` float32 in [0, 1]."""
        z = latents.to(self.device, torch.float32)
        z = z / self.scaling_factor + self.shift_factor
        image = self.vae.decode(z.to(self.vae_dtype), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
