"""``HunyuanVideo15Bundle``: the HunyuanVideo 1.5 modules (the trainable
``HunyuanVideo15Transformer3DModel``, the frozen Qwen2.5-VL text encoder, the ByT5 glyph
encoder and the 3D causal VAE) and HunyuanVideo 1.5's own part of the family contract:
loading, prompt encoding, the velocity call, the static-shift σ policy, video latent geometry
and decode. The rest is :class:`~unirl.models.common.bundle.FlowMatchingBundle`'s.

Latents are the VAE's own ``[N, 32, F, H/16, W/16]`` with ``F = (num_frames - 1) / 4 + 1``,
un-normalised by one ``scaling_factor`` at decode; the transformer's patch is 1 (one token
per latent pixel). Every forward concatenates, along channels, 32 condition-latent channels
and one mask channel to the noisy latent: both zero for text-to-video (what the pipeline
passes), and the image embeddings are zero, masked-out slots. Guidance is batched CFG
(``[negative; prompt]`` rows in one forward): both encoders pad every prompt to a fixed
length, so the rows stack.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from unirl.config.require import require
from unirl.models.common.config_dict import config_int
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.geometry import sigma_per_sample, video_pixels
from unirl.models.hunyuan_video.arch import HunyuanVideo15ArchSpec, build_arch_modules
from unirl.models.hunyuan_video.conditions import HunyuanVideo15Conditions
from unirl.models.hunyuan_video.config import (
    HUNYUAN_VIDEO_VAE,
    HunyuanVideo15BundleConfig,
    check_num_frames,
)
from unirl.models.hunyuan_video.engine_maps import HunyuanVideo15EngineMaps
from unirl.models.hunyuan_video.presets import (
    architecture_configs,
    load_folder,
    resolve_model_source,
    scheduler_config_of,
)
from unirl.models.hunyuan_video.shared import HunyuanVideoFamilyBundle, HunyuanVideoGeneration
from unirl.models.hunyuan_video.text_encode import encode_glyph_prompts, encode_mllm_prompts


class HunyuanVideo15Bundle(HunyuanVideoFamilyBundle):
    """HunyuanVideo 1.5 (text-to-video) weights for rollout and training.

    Keyword arguments are the fields of :class:`HunyuanVideo15BundleConfig` (a recipe block
    ``{_target_: unirl.models.hunyuan_video.HunyuanVideo15Bundle, path: ..., dtype: bf16}``
    builds it); ``HunyuanVideo15Bundle.from_config(config)`` takes a config whole.
    """

    config_class: ClassVar[type[HunyuanVideo15BundleConfig]] = HunyuanVideo15BundleConfig
    config: HunyuanVideo15BundleConfig
    generation: ClassVar[HunyuanVideoGeneration] = HunyuanVideoGeneration(
        label="HunyuanVideo 1.5",
        transformer_class="HunyuanVideo15Transformer3DModel",
        spatial_factor=16,
        patch=1,
        arch_spec=HunyuanVideo15ArchSpec,
        architecture_configs=architecture_configs,
        resolve_model_source=resolve_model_source,
        build_arch_modules=build_arch_modules,
        load_folder=load_folder,
        scheduler_config_of=scheduler_config_of,
        check_num_frames=check_num_frames,
    )
    frozen_module_names: ClassVar[tuple[str, ...]] = ("text_encoder", "text_encoder_2", "vae")
    # vLLM-Omni's dialect of this family (engine_maps.py)
    engine_maps: ClassVar[EngineMaps | None] = HunyuanVideo15EngineMaps()
    video_vae: ClassVar[str] = HUNYUAN_VIDEO_VAE
    block_class_names: ClassVar[tuple[str, ...]] = ("HunyuanVideo15TransformerBlock",)
    # both streams' attention projections of every dual-stream block (the token refiner's
    # self-attention shares the to_q / to_k / to_v / to_out.0 names and is adapted too)
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
            int(tcfg.in_channels) == 2 * self.latent_channels + 1,
            f"transformer in_channels={tcfg.in_channels} is not 2·{self.latent_channels} + 1 "
            "(noise, condition latents, mask): not a HunyuanVideo 1.5 checkpoint",
        )
        require(
            not bool(getattr(tcfg, "use_meanflow", False)),
            f"bundle.path={cfg.path!r} is a step-distilled (MeanFlow) checkpoint, which needs a "
            "second timestep UniRL does not pass; use a text-to-video checkpoint",
        )
        self.patch = int(tcfg.patch_size)
        self.patch_t = int(tcfg.patch_size_t)
        self.image_embed_dim = int(tcfg.image_embed_dim)
        self.temporal_factor = int(vcfg.temporal_compression_ratio)
        self.spatial_factor = int(vcfg.spatial_compression_ratio)
        self.scaling_factor = float(vcfg.scaling_factor)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)

    # -- encode --------------------------------------------------------------------------------

    def encode_unique(self, texts: list[str]) -> HunyuanVideo15Conditions:
        cfg = self.config
        embeds, mask = encode_mllm_prompts(
            self.tokenizer,
            self.text_encoder,
            texts,
            max_sequence_length=cfg.max_sequence_length,
        )
        glyph, glyph_mask = encode_glyph_prompts(
            self.tokenizer_2,
            self.text_encoder_2,
            texts,
            max_sequence_length=cfg.glyph_max_sequence_length,
        )
        return HunyuanVideo15Conditions(
            prompt_embeds=embeds.to(self.device),
            prompt_mask=mask.to(self.device),
            glyph_embeds=glyph.to(self.device),
            glyph_mask=glyph_mask.to(self.device),
        )

    def with_negative(  # type: ignore[override]
        self, conditions: HunyuanVideo15Conditions, negative: HunyuanVideo15Conditions
    ) -> HunyuanVideo15Conditions:
        return conditions.with_negative(negative)

    def cfg_conditions(self, conditions: HunyuanVideo15Conditions) -> HunyuanVideo15Conditions:
        """``[negative rows; prompt rows]`` (2·N) for one batched CFG forward."""
        return conditions.cfg_pairs()

    # -- velocity ------------------------------------------------------------------------------

    def predict_velocity(
        self,
        latents: torch.Tensor,
        sigma: torch.Tensor | float,
        conditions: HunyuanVideo15Conditions,
    ) -> torch.Tensor:
        """``v[B, C, F, h, w]`` (fp32) for ``latents[B, C, F, h, w]`` at ``sigma`` (``[B]`` or
        scalar), with the rows of ``conditions`` (``B`` rows).

        As the pipeline calls the transformer: the latent, zero condition latents and a zero
        mask along channels, in the transformer's dtype; ``timestep = σ·num_train_timesteps``
        in the same dtype; ``image_tokens`` zero image embeddings (the transformer masks them
        out when all are zero).
        """
        b = latents.shape[0]
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=latents.device)
        x = latents.to(self.device, self.dtype)
        _, c, f, h, w = x.shape
        hidden = torch.cat([x, x.new_zeros(b, c + 1, f, h, w)], dim=1)
        timestep = (sigma_t * self.num_train_timesteps).to(self.device, self.dtype)
        image_embeds = x.new_zeros(b, self.config.image_tokens, self.image_embed_dim)
        with self.sdpa_context(), self.autocast():
            v = self.transformer(
                hidden_states=hidden,
                timestep=timestep,
                encoder_hidden_states=conditions.prompt_embeds.to(self.device, self.dtype),
                encoder_attention_mask=conditions.prompt_mask.to(self.device),
                encoder_hidden_states_2=conditions.glyph_embeds.to(self.device, self.dtype),
                encoder_attention_mask_2=conditions.glyph_mask.to(self.device),
                image_embeds=image_embeds,
                return_dict=False,
            )[0]
        return v.float()

    # -- geometry and decode ------------------------------------------------------------------

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Un-scales as the pipeline does (``z / scaling_factor`` in the VAE's dtype) and decodes
        one video per VAE call (the decoder's causal mid attention builds a mask that only
        broadcasts over a batch of one); ``pixels[B, T, 3, H, W]`` float32 in [0, 1]."""
        z = latents.to(self.device, self.vae_dtype) / self.scaling_factor
        videos = [self.vae.decode(row[None], return_dict=False)[0] for row in z]
        video = torch.cat(videos)  # [B, 3, T, H, W] in [-1, 1]
        return video_pixels(video)
