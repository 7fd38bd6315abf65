"""``HunyuanVideoBundle``: the HunyuanVideo 1.0 modules (the trainable
``HunyuanVideoTransformer3DModel``, the frozen Llama and CLIP text encoders and the 3D causal
VAE) and HunyuanVideo 1.0's own part of the family contract: loading, prompt encoding, the
velocity call with the embedded guidance scale, the static-shift σ policy, video latent
geometry and decode. The rest is :class:`~unirl.models.common.bundle.FlowMatchingBundle`'s.

Latents are the VAE's own ``[N, 16, F, H/8, W/8]`` with ``F = (num_frames - 1) / 4 + 1``,
un-normalised by one ``scaling_factor`` at decode; the transformer cuts 2x2 patches. The
model is guidance-distilled: :class:`~unirl.models.hunyuan_video_v1.guidance.EmbeddedGuidance`
(one conditional forward, ``guidance = sampling.guidance_scale · 1000`` embedded).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from unirl.config.require import require
from unirl.models.common.config_dict import config_int
from unirl.models.common.geometry import sigma_per_sample, video_pixels
from unirl.models.common.guidance import Guidance
from unirl.models.hunyuan_video.shared import HunyuanVideoFamilyBundle, HunyuanVideoGeneration
from unirl.models.hunyuan_video_v1.arch import HunyuanVideoArchSpec, build_arch_modules
from unirl.models.hunyuan_video_v1.conditions import HunyuanVideoConditions
from unirl.models.hunyuan_video_v1.config import (
    HUNYUAN_VIDEO_VAE,
    HunyuanVideoBundleConfig,
    check_num_frames,
)
from unirl.models.hunyuan_video_v1.guidance import EmbeddedGuidance
from unirl.models.hunyuan_video_v1.presets import (
    architecture_configs,
    load_folder,
    resolve_model_source,
    scheduler_config_of,
)
from unirl.models.hunyuan_video_v1.text_encode import (
    encode_clip_pooled,
    encode_llama_prompts,
    pipeline_prompt_template,
)

# diffusers multiplies the embedded guidance scale by this before the transformer sees it
GUIDANCE_EMBED_SCALE = 1000.0


class HunyuanVideoBundle(HunyuanVideoFamilyBundle):
    """HunyuanVideo 1.0 (text-to-video) weights for rollout and training.

    Keyword arguments are the fields of :class:`HunyuanVideoBundleConfig` (a recipe block
    ``{_target_: unirl.models.hunyuan_video_v1.HunyuanVideoBundle, path: ..., dtype: bf16}``
    builds it); ``HunyuanVideoBundle.from_config(config)`` takes a config whole.
    """

    config_class: ClassVar[type[HunyuanVideoBundleConfig]] = HunyuanVideoBundleConfig
    config: HunyuanVideoBundleConfig
    generation: ClassVar[HunyuanVideoGeneration] = HunyuanVideoGeneration(
        label="HunyuanVideo",
        transformer_class="HunyuanVideoTransformer3DModel",
        spatial_factor=8,
        patch=2,
        arch_spec=HunyuanVideoArchSpec,
        architecture_configs=architecture_configs,
        resolve_model_source=resolve_model_source,
        build_arch_modules=build_arch_modules,
        load_folder=load_folder,
        scheduler_config_of=scheduler_config_of,
        check_num_frames=check_num_frames,
    )
    frozen_module_names: ClassVar[tuple[str, ...]] = ("text_encoder", "text_encoder_2", "vae")
    guidance: ClassVar[Guidance] = EmbeddedGuidance()
    video_vae: ClassVar[str] = HUNYUAN_VIDEO_VAE
    block_class_names: ClassVar[tuple[str, ...]] = (
        "HunyuanVideoTransformerBlock",
        "HunyuanVideoSingleTransformerBlock",
    )
    # the attention projections of every dual-stream block (both streams) and single-stream
    # block (the token refiner's self-attention shares to_q / to_k / to_v / to_out.0)
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

    # -- modules -------------------------------------------------------------------------------

    def load(self) -> None:
        self.load_modules()
        cfg = self.config

        # Geometry, read once before anyone wraps the transformer.
        tcfg = self.transformer.config
        vcfg = self.vae.config
        self.latent_channels = int(vcfg.latent_channels)
        require(
            int(tcfg.in_channels) == self.latent_channels,
            f"transformer in_channels={tcfg.in_channels} is not the VAE's "
            f"{self.latent_channels} latent channels: not a HunyuanVideo 1.0 text-to-video "
            "checkpoint (image-to-video ones concatenate condition latents)",
        )
        require(
            bool(tcfg.guidance_embeds) and tcfg.image_condition_type is None,
            f"bundle.path={cfg.path!r}: the transformer has guidance_embeds="
            f"{tcfg.guidance_embeds}, image_condition_type={tcfg.image_condition_type!r}; "
            "UniRL reads the guidance-distilled text-to-video model (True, None) only",
        )
        self.patch = int(tcfg.patch_size)
        self.temporal_factor = int(vcfg.temporal_compression_ratio)
        self.spatial_factor = int(vcfg.spatial_compression_ratio)
        self.scaling_factor = float(vcfg.scaling_factor)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)
        self.clip_max_length = pipeline_prompt_template().clip_max_length

    # -- encode --------------------------------------------------------------------------------

    def encode_unique(self, texts: list[str]) -> HunyuanVideoConditions:
        embeds, mask = encode_llama_prompts(
            self.tokenizer,
            self.text_encoder,
            texts,
            max_sequence_length=self.config.max_sequence_length,
        )
        pooled = encode_clip_pooled(
            self.tokenizer_2, self.text_encoder_2, texts, max_length=self.clip_max_length
        )
        return HunyuanVideoConditions(
            prompt_embeds=embeds.to(self.device),
            prompt_mask=mask.to(self.device),
            pooled=pooled.to(self.device),
        )

    def with_negative(  # type: ignore[override]
        self, conditions: HunyuanVideoConditions, negative: HunyuanVideoConditions
    ) -> HunyuanVideoConditions:
        """The rows unchanged: a guidance-distilled model has no unconditional forward, so
        the negative prompt is never read (as in diffusers without ``true_cfg_scale``)."""
        return conditions

    # -- velocity ------------------------------------------------------------------------------

    def predict_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor | float,
        conditions: HunyuanVideoConditions,
    ) -> torch.Tensor:
        """``v[B, C, F, h, w]`` (fp32) for ``latents[B, C, F, h, w]`` at ``sigma`` (``[B]`` or
        scalar), with the rows of ``conditions`` (``B`` rows, their ``guidance`` set).

        As the pipeline calls the transformer: the latent in the transformer's dtype;
        ``timestep = σ·num_train_timesteps`` in fp32 (the pipeline casts it to the latents'
        dtype, which it keeps in fp32); the Llama rows with their mask, the CLIP pooled rows
        and ``guidance = g·1000``, all three in the transformer's dtype.
        """
        require(
            conditions.guidance is not None,
            "HunyuanVideoBundle.predict_velocity: the conditions carry no guidance scale "
            "(call it through the pipeline, or conditions.with_guidance(scale))",
        )
        assert conditions.guidance is not None
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=latents.device)
        x = latents.to(self.device, self.dtype)
        timestep = (sigma_t * self.num_train_timesteps).to(self.device, torch.float32)
        guidance = (conditions.guidance.to(self.device, self.dtype)) * GUIDANCE_EMBED_SCALE
        with self.sdpa_context(), self.autocast():
            v = self.transformer(
                hidden_states=x,
                timestep=timestep,
                encoder_hidden_states=conditions.prompt_embeds.to(self.device, self.dtype),
                encoder_attention_mask=conditions.prompt_mask.to(self.device, self.dtype),
                pooled_projections=conditions.pooled.to(self.device, self.dtype),
                guidance=guidance,
                return_dict=False,
            )[0]
        return v.float()

    # -- geometry and decode ------------------------------------------------------------------

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Un-scales as the pipeline does (``z / scaling_factor`` in the VAE's dtype) and
        decodes; ``pixels[B, T, 3, H, W]`` float32 in [0, 1]."""
        z = latents.to(self.device, self.vae_dtype) / self.scaling_factor
        video = self.vae.decode(z, return_dict=False)[0]  # [B, 3, T, H, W] in [-1, 1]
        return video_pixels(video)
