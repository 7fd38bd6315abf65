"""``ZImageBundle``: the Z-Image modules (trainable single-stream DiT + frozen Qwen3 text
encoder and FLUX-format VAE) and Z-Image's own part of the family contract: loading, prompt
encoding, the velocity call on caption lists, Z-Image's CFG, the static-shift σ policy, latent
geometry and decode. The rest is :class:`~unirl.models.common.bundle.FlowMatchingBundle`'s.

Latents are the VAE's ``[N, 16, H/8, W/8]`` (the transformer patchifies 2x2 inside). The
transformer takes lists: one ``[C, 1, h, w]`` latent and one ``[L_i, D]`` caption per sample,
and a time ``t = 1 − σ`` (data at 1); its output points from noise to data, so the velocity
of UniRL's loop (``x_{σ'} = x_σ + v·(σ' − σ)``) is its negation, as the pipeline's
``noise_pred = -noise_pred`` makes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from unirl.config.require import require
from unirl.models.common.arch import model_from_config
from unirl.models.common.bundle import FlowMatchingBundle, require_size_multiple
from unirl.models.common.config_dict import ConfigDict, config_int
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.folders import load_parts, read_diffusers_folder
from unirl.models.common.geometry import VAELatentGeometry, sigma_per_sample
from unirl.models.common.guidance import Guidance
from unirl.models.z_image.arch import build_arch_modules
from unirl.models.z_image.conditions import ZImageConditions, padded
from unirl.models.z_image.config import ZImageBundleConfig
from unirl.models.z_image.engine_maps import ZImageEngineMaps
from unirl.models.z_image.guidance import ZImageCFG
from unirl.models.z_image.presets import architecture_configs, resolve_model_source
from unirl.models.z_image.text_encode import encode_z_image_prompts

if TYPE_CHECKING:
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL

# captions take RoPE positions 1.. and the image the next one on the first axis
PIPELINE_TIMESTEP_SCALE = 1000.0  # ZImagePipeline: timestep = (1000 - σ·N) / 1000


def _read_folder(folder: Path, bundle: ZImageBundle) -> dict[str, Any]:
    """Components of a diffusers Z-Image folder (``save_pretrained`` layout), on CPU, cast."""
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
    from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel
    from transformers import Qwen3Model

    return read_diffusers_folder(
        folder,
        bundle,
        transformer=ZImageTransformer2DModel,
        vae=AutoencoderKL,
        text_encoders={"text_encoder": Qwen3Model},
        tokenizers=("tokenizer",),
    )


class ZImageBundle(VAELatentGeometry, FlowMatchingBundle):
    """Z-Image weights for rollout and training.

    Keyword arguments are the fields of :class:`ZImageBundleConfig` (a recipe block
    ``{_target_: unirl.models.z_image.ZImageBundle, path: Tongyi-MAI/Z-Image, dtype: bf16}``
    builds it); ``ZImageBundle.from_config(config)`` takes a config whole.
    ``self.transformer`` is the trainable module; ``self.guidance`` is a :class:`ZImageCFG`
    with the config's ``cfg_normalization`` / ``cfg_truncation``.
    """

    config_class: ClassVar[type[ZImageBundleConfig]] = ZImageBundleConfig
    config: ZImageBundleConfig
    # the pipeline's defaults; load() sets the instance's from the config's CFG knobs
    guidance: ClassVar[Guidance] = ZImageCFG()
    frozen_module_names: ClassVar[tuple[str, ...]] = ("text_encoder", "vae")
    block_class_names: ClassVar[tuple[str, ...]] = ("ZImageTransformerBlock",)
    # the caption is the prompt's length padded to a multiple of 32, so prompts give new joint
    # sequence lengths: symbolic shapes from the first compile (docs/performance.md, calls 14-15)
    compile_dynamic: ClassVar[bool | None] = True
    # every attention projection (noise / context refiners and the main blocks)
    lora_default_targets: ClassVar[tuple[str, ...]] = ("to_q", "to_k", "to_v", "to_out.0")
    engine_maps: ClassVar[EngineMaps | None] = ZImageEngineMaps()

    # -- checks before anything is built ----------------------------------------------------

    @classmethod
    def architecture(cls, path: str) -> tuple[dict, dict] | None:
        return architecture_configs(path)

    @classmethod
    def check_image_size(cls, architecture: tuple[dict, dict], key: str, size: int) -> None:
        transformer, vae = architecture
        vae_factor = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1)
        patch = int(transformer.get("all_patch_size", [2])[0])
        multiple = vae_factor * patch
        require_size_multiple(
            key, size, multiple, f"VAE factor {vae_factor} x {patch}x{patch} patches of Z-Image"
        )
        axis = 1 if key == "height" else 2
        rope_rows = int(transformer.get("axes_lens", [1536, 512, 512])[axis])
        require(
            size // multiple <= rope_rows,
            f"sampling.{key}={size} is {size // multiple} tokens, more than this model's RoPE "
            f"table holds (axes_lens[{axis}]={rope_rows}: at most {rope_rows * multiple} pixels)",
        )

    @classmethod
    def trainable_from_architecture(cls, architecture: tuple[dict, dict]) -> torch.nn.Module:
        from diffusers.models.transformers.transformer_z_image import ZImageTransformer2DModel

        return model_from_config(ZImageTransformer2DModel, architecture[0])

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
        self.vae: AutoencoderKL = parts["vae"]
        self.text_encoder: torch.nn.Module = parts["text_encoder"]
        self.tokenizer = parts["tokenizer"]
        # per instance: the knobs are the config's (guidance_of reads the attribute)
        self.guidance = ZImageCFG(  # type: ignore[misc]
            normalization=cfg.cfg_normalization,
            truncation=cfg.cfg_truncation,
            split_uneven=cfg.cfg_split_uneven,
        )
        # the pipeline hands the scheduler torch.linspace(1, 1/T, T) (float32) pre-shift σ
        self.scheduler_config: ConfigDict = {
            **parts["scheduler_config"],
            "sigma_spacing": "linspace_fp32",
        }

        # Geometry, read once before anyone wraps the transformer.
        tcfg, vcfg = self.transformer.config, self.vae.config
        self.latent_channels = int(tcfg.in_channels)
        self.patch_size = int(tcfg.all_patch_size[0])
        self.vae_scale_factor = 2 ** (len(vcfg.block_out_channels) - 1)
        self.scaling_factor = float(vcfg.scaling_factor)
        self.shift_factor = float(vcfg.shift_factor)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)
        if int(vcfg.latent_channels) != self.latent_channels:
            raise ValueError(
                f"transformer in_channels={self.latent_channels} is not the VAE's "
                f"latent_channels={vcfg.latent_channels}"
            )
        text_width = int(self.text_encoder.config.hidden_size)
        if text_width != int(tcfg.cap_feat_dim):
            raise ValueError(
                f"text encoder hidden_size={text_width} is not the transformer's "
                f"cap_feat_dim={tcfg.cap_feat_dim}"
            )
        caption_rows = int(tcfg.axes_lens[0])
        require(
            padded(cfg.max_sequence_length) + 1 < caption_rows,
            f"bundle.max_sequence_length={cfg.max_sequence_length} needs "
            f"{padded(cfg.max_sequence_length) + 2} RoPE positions on the caption axis; this "
            f"model has axes_lens[0]={caption_rows}: lower it",
        )

    # -- encode --------------------------------------------------------------------------------

    def encode_unique(self, texts: list[str]) -> ZImageConditions:
        captions = encode_z_image_prompts(
            self.tokenizer,
            self.text_encoder,
            texts,
            max_sequence_length=self.config.max_sequence_length,
        )
        return ZImageConditions(prompt_embeds=captions).to(self.device)

    def with_negative(  # type: ignore[override]
        self, conditions: ZImageConditions, negative: ZImageConditions
    ) -> ZImageConditions:
        return ZImageConditions(
            prompt_embeds=conditions.prompt_embeds,
            negative_prompt_embeds=negative.prompt_embeds.select([0] * len(conditions)),
        )

    def recompile_hint(self) -> str | None:
        """With the prompt's and the negative's captions in one masked CFG batch, a compiled
        block was specialized per caption length on CUDA (``ZImageCFG.split_uneven``)."""
        if self.config.cfg_split_uneven:
            return None
        return (
            "set bundle.cfg_split_uneven=true (a CFG batch of captions that pad to different "
            "lengths passes an attention mask, and on CUDA the masked compiled block is "
            "specialized to each caption length)"
        )

    # -- velocity ------------------------------------------------------------------------------

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor | float, conditions: ZImageConditions
    ) -> torch.Tensor:
        """``v[B, C, h, w]`` (fp32) for ``latents[B, C, h, w]`` at ``sigma`` (``[B]`` or
        scalar), with the prompt captions of ``conditions`` (``B`` rows).

        As the pipeline calls it: ``t = (1000 − σ·N) / 1000`` in float32 (``N`` the
        scheduler's ``num_train_timesteps``), one ``[C, 1, h, w]`` latent and one caption
        per sample, and the output negated.
        """
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=self.device)
        scale = PIPELINE_TIMESTEP_SCALE
        timestep = (scale - sigma_t * self.num_train_timesteps) / scale
        captions = [c.to(self.device, self.dtype) for c in conditions.captions()]
        frames = list(latents.to(self.device, self.dtype).unsqueeze(2).unbind(0))
        with self.sdpa_context(), self.autocast():
            out = self.transformer(frames, timestep, captions, return_dict=False)[0]
        return -torch.stack([o.float() for o in out]).squeeze(2)

    # -- geometry and decode ------------------------------------------------------------------

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Un-normalises as the pipeline does (``z / scaling_factor + shift_factor`` in the
        VAE's dtype) and decodes; ``pixels[B, 3, H, W]`` float32 in [0, 1]."""
        z = latents.to(self.device, self.vae_dtype)
        z = z / self.scaling_factor + self.shift_factor
        image = self.vae.decode(z, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
