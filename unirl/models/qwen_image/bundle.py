"""``QwenImageBundle``: the Qwen-Image modules (trainable MMDiT + frozen Qwen2.5-VL text
encoder and VAE) and Qwen-Image's own part of the family contract: loading, prompt encoding,
the velocity call on packed latents, true CFG with norm rescale, the dynamic-shift σ policy,
latent geometry and decode. The rest is
:class:`~unirl.models.common.bundle.FlowMatchingBundle`'s.

Latents are carried *packed*, as the transformer reads them: ``[N, H/16, W/16, 4·C]``, one
2x2 patch of the 16-channel VAE latent per token, channels last. ``reshape(N, L, 4·C)`` is
diffusers' packed sequence (same element order), the token grid gives ``img_shapes``, and
the guidance's per-token norms run over the last dimension.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from unirl.models.common.arch import model_from_config
from unirl.models.common.bundle import FlowMatchingBundle, require_size_multiple
from unirl.models.common.config_dict import ConfigDict, config_int
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.folders import load_parts, read_diffusers_folder
from unirl.models.common.geometry import PATCH, PackedLatentGeometry, sigma_per_sample
from unirl.models.common.guidance import Guidance, NormRescaledCFG
from unirl.models.qwen_image.arch import build_arch_modules
from unirl.models.qwen_image.conditions import QwenImageConditions
from unirl.models.qwen_image.config import QwenImageBundleConfig
from unirl.models.qwen_image.engine_maps import QwenImageEngineMaps
from unirl.models.qwen_image.presets import architecture_configs, resolve_model_source
from unirl.models.qwen_image.text_encode import encode_qwen_prompts


def _read_folder(folder: Path, bundle: QwenImageBundle) -> dict[str, Any]:
    """Components of a diffusers Qwen-Image folder (``save_pretrained`` layout), on CPU, cast."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    return read_diffusers_folder(
        folder,
        bundle,
        transformer=QwenImageTransformer2DModel,
        vae=AutoencoderKLQwenImage,
        text_encoders={"text_encoder": Qwen2_5_VLForConditionalGeneration},
        tokenizers=("tokenizer",),
    )


class QwenImageBundle(PackedLatentGeometry, FlowMatchingBundle):
    """Qwen-Image weights for rollout and training.

    Keyword arguments are the fields of :class:`QwenImageBundleConfig` (a recipe block
    ``{_target_: unirl.models.qwen_image.QwenImageBundle, path: Qwen/Qwen-Image, dtype: bf16}``
    builds it); ``QwenImageBundle.from_config(config)`` takes a config whole.
    ``self.transformer`` is the trainable module.
    """

    config_class: ClassVar[type[QwenImageBundleConfig]] = QwenImageBundleConfig
    config: QwenImageBundleConfig
    guidance: ClassVar[Guidance] = NormRescaledCFG(channel_dim=-1)
    frozen_module_names: ClassVar[tuple[str, ...]] = ("text_encoder", "vae")
    block_class_names: ClassVar[tuple[str, ...]] = ("QwenImageTransformerBlock",)
    # the text length is the prompt's (cut at its last token), so every prompt is a new joint
    # sequence length: symbolic shapes from the first compile (docs/performance.md, calls 14-15)
    compile_dynamic: ClassVar[bool | None] = True
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
    engine_maps: ClassVar[EngineMaps | None] = QwenImageEngineMaps()

    # -- checks before anything is built ----------------------------------------------------

    @classmethod
    def architecture(cls, path: str) -> tuple[dict, dict] | None:
        return architecture_configs(path)

    @classmethod
    def check_image_size(cls, architecture: tuple[dict, dict], key: str, size: int) -> None:
        transformer, vae = architecture
        vae_factor = 2 ** len(vae.get("temperal_downsample", (False, True, True)))
        patch = int(transformer.get("patch_size", PATCH))
        require_size_multiple(
            key,
            size,
            vae_factor * patch,
            f"VAE factor {vae_factor} x {patch}x{patch} packing of Qwen-Image",
        )

    @classmethod
    def trainable_from_architecture(cls, architecture: tuple[dict, dict]) -> torch.nn.Module:
        from diffusers import QwenImageTransformer2DModel

        return model_from_config(QwenImageTransformer2DModel, architecture[0])

    # -- modules -------------------------------------------------------------------------------

    def load(self) -> None:
        cfg = self.config
        self.source = resolve_model_source(cfg.path)
        parts = load_parts(
            self,
            self.source,
            build_arch=build_arch_modules,
            read_folder=_read_folder,
        )
        self.transformer: torch.nn.Module = parts["transformer"]
        self.vae: torch.nn.Module = parts["vae"]
        self.text_encoder: torch.nn.Module = parts["text_encoder"]
        self.tokenizer = parts["tokenizer"]
        # the diffusers pipeline hands the scheduler linspace(1, 1/T, T) pre-shift sigmas
        self.scheduler_config: ConfigDict = {
            **parts["scheduler_config"],
            "sigma_spacing": "linspace",
        }

        # Geometry, read once before anyone wraps the transformer.
        vcfg = self.vae.config
        self.latent_channels = int(vcfg.z_dim)
        self.vae_scale_factor = 2 ** len(vcfg.temperal_downsample)
        self.packed_channels = int(self.transformer.config.in_channels)
        self.check_packing(self.latent_channels)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)
        shape = (1, self.latent_channels, 1, 1, 1)
        self._latents_mean = torch.tensor(vcfg.latents_mean).view(shape)
        self._latents_std = torch.tensor(vcfg.latents_std).view(shape)

    # -- encode --------------------------------------------------------------------------------

    def encode_unique(self, texts: list[str]) -> QwenImageConditions:
        embeds, mask = encode_qwen_prompts(
            self.tokenizer,
            self.text_encoder,
            texts,
            max_sequence_length=self.config.max_sequence_length,
        )
        return QwenImageConditions(
            prompt_embeds=embeds.to(self.device), prompt_mask=mask.to(self.device)
        )

    def with_negative(  # type: ignore[override]
        self, conditions: QwenImageConditions, negative: QwenImageConditions
    ) -> QwenImageConditions:
        n = len(conditions)
        mask = negative.prompt_mask
        return QwenImageConditions(
            prompt_embeds=conditions.prompt_embeds,
            prompt_mask=conditions.prompt_mask,
            negative_prompt_embeds=negative.prompt_embeds.expand(n, -1, -1),
            negative_prompt_mask=None if mask is None else mask.expand(n, -1),
        )

    # -- velocity ------------------------------------------------------------------------------

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor | float, conditions: QwenImageConditions
    ) -> torch.Tensor:
        """``v[B, h, w, 4·C]`` (fp32) for packed ``latents[B, h, w, 4·C]`` at ``sigma``
        (``[B]`` or scalar), with the prompt rows of ``conditions`` (``B`` rows).

        As diffusers calls it: ``timestep = (σ·num_train_timesteps)`` in the latents' dtype,
        divided by 1000; ``img_shapes`` from the token grid; the text mask as given (None
        when every token is real).
        """
        b, grid_h, grid_w, channels = latents.shape
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=latents.device)
        timestep = (sigma_t * self.num_train_timesteps).to(self.device, self.dtype) / 1000
        mask = conditions.prompt_mask
        with self.sdpa_context(), self.autocast():
            v = self.transformer(
                hidden_states=latents.to(self.device, self.dtype).reshape(b, -1, channels),
                timestep=timestep,
                encoder_hidden_states=conditions.prompt_embeds.to(self.device, self.dtype),
                encoder_hidden_states_mask=None if mask is None else mask.to(self.device),
                img_shapes=[[(1, grid_h, grid_w)]] * b,
                return_dict=False,
            )[0]
        return v.float().reshape(b, grid_h, grid_w, channels)

    # -- geometry and decode ------------------------------------------------------------------

    def unpack(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed ``[B, h, w, 4·C]`` -> the VAE's ``[B, C, 1, 2h, 2w]`` (one frame)."""
        b, grid_h, grid_w, channels = latents.shape
        c = channels // (PATCH * PATCH)
        z = latents.reshape(b, grid_h, grid_w, c, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
        return z.reshape(b, c, 1, grid_h * PATCH, grid_w * PATCH)

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Unpacks, un-normalises as diffusers does (``z / (1/std) + mean`` in the VAE's dtype)
        and decodes the one frame; ``pixels[B, 3, H, W]`` float32 in [0, 1]."""
        z = self.unpack(latents.to(self.device)).to(self.vae_dtype)
        inv_std = 1.0 / self._latents_std.to(z.device, z.dtype)
        z = z / inv_std + self._latents_mean.to(z.device, z.dtype)
        image = self.vae.decode(z, return_dict=False)[0][:, :, 0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
