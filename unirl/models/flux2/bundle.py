"""``Flux2KleinBundle``: the FLUX.2-Klein modules (trainable DiT + frozen Qwen3 text encoder and
VAE) and FLUX.2-Klein's own part of the family contract: loading, prompt encoding, reference
images for editing, the velocity call on packed latents with 4-axis positions, guidance (none
for step-distilled checkpoints, true CFG for base ones), the empirical-μ σ policy, latent
geometry and decode. The rest is :class:`~unirl.models.common.bundle.FlowMatchingBundle`'s.

Latents are carried *packed*, as the transformer reads them: ``[N, H/16, W/16, 4·C]``, one 2x2
patch of the C-channel VAE latent per token (channel ``c·4 + 2·dy + dx``), normalised by the
VAE's batch-norm statistics, channels last. ``reshape(N, L, 4·C)`` is diffusers' packed
sequence element for element.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from unirl.config.require import ConfigError
from unirl.models.common.arch import model_from_config
from unirl.models.common.bundle import FlowMatchingBundle, require_size_multiple
from unirl.models.common.config_dict import ConfigDict, config_int
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.folders import load_parts, read_diffusers_folder
from unirl.models.common.geometry import PATCH, PackedLatentGeometry, sigma_per_sample
from unirl.models.common.guidance import Guidance, NoGuidance, SeparateCFG
from unirl.models.common.presets import ModelSourceError
from unirl.models.flux2.arch import build_arch_modules
from unirl.models.flux2.conditions import Flux2KleinConditions
from unirl.models.flux2.config import Flux2KleinBundleConfig
from unirl.models.flux2.engine_maps import Flux2KleinEngineMaps
from unirl.models.flux2.presets import (
    architecture_configs,
    folder_is_distilled,
    resolve_model_source,
    source_is_distilled,
)
from unirl.models.flux2.text_encode import encode_klein_prompts, pipeline_text_layers
from unirl.models.flux2.tiny import patchify, unpatchify
from unirl.types import host_to_device

REFERENCE_TIME = 10  # the time coordinate of the (first) reference image's tokens
MAX_REFERENCE_PIXELS = 1024 * 1024  # the pipelines shrink larger references to this area
PositionKey = tuple[
    str | int | torch.device, ...
]  # (kind, sizes..., device) of cached position ids


def _read_folder(folder: Path, bundle: Flux2KleinBundle) -> dict[str, Any]:
    """Components of a diffusers FLUX.2-Klein folder (``save_pretrained`` layout), on CPU, cast."""
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3ForCausalLM

    parts = read_diffusers_folder(
        folder,
        bundle,
        transformer=Flux2Transformer2DModel,
        vae=AutoencoderKLFlux2,
        text_encoders={"text_encoder": Qwen3ForCausalLM},
        tokenizers=("tokenizer",),
    )
    return {**parts, "is_distilled": folder_is_distilled(folder)}


def grid_position_ids(time: int, height: int, width: int) -> torch.Tensor:
    """``ids[height·width, 4]`` (long): ``(time, row, col, 0)`` of every token of a token grid,
    row-major (the generated image at ``time=0``, a reference at ``time=10``)."""
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    return torch.stack(
        [torch.full_like(rows, time), rows, cols, torch.zeros_like(rows)], dim=-1
    ).reshape(-1, 4)


def text_position_ids(length: int) -> torch.Tensor:
    """``ids[length, 4]`` (long): ``(0, 0, 0, l)`` for text token ``l``."""
    ids = torch.zeros(length, 4, dtype=torch.long)
    ids[:, 3] = torch.arange(length)
    return ids


class Flux2KleinBundle(PackedLatentGeometry, FlowMatchingBundle):
    """FLUX.2-Klein weights for rollout and training.

    Keyword arguments are the fields of :class:`Flux2KleinBundleConfig` (a recipe block
    ``{_target_: unirl.models.flux2.Flux2KleinBundle, path: black-forest-labs/FLUX.2-klein-4B,
    dtype: bf16}`` builds it); ``Flux2KleinBundle.from_config(config)`` takes a config whole.
    ``self.transformer`` is the trainable module. ``is_distilled`` (the checkpoint's
    ``model_index.json``) decides the guidance: :class:`NoGuidance` for step-distilled
    checkpoints (a scale above 1 is refused), :class:`SeparateCFG` for base ones.
    """

    config_class: ClassVar[type[Flux2KleinBundleConfig]] = Flux2KleinBundleConfig
    config: Flux2KleinBundleConfig
    # the class default; ``load`` sets the instance's from the checkpoint (base: SeparateCFG)
    guidance: ClassVar[Guidance] = NoGuidance()
    frozen_module_names: ClassVar[tuple[str, ...]] = ("text_encoder", "vae")
    block_class_names: ClassVar[tuple[str, ...]] = (
        "Flux2TransformerBlock",
        "Flux2SingleTransformerBlock",
    )
    # double-stream attention (both streams) and the single-stream fused QKV + MLP input;
    # the single blocks' output projection is named ``to_out`` like the double blocks'
    # ModuleList, so a suffix cannot pick it alone
    lora_default_targets: ClassVar[tuple[str, ...]] = (
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
        "to_qkv_mlp_proj",
    )
    engine_maps: ClassVar[EngineMaps | None] = Flux2KleinEngineMaps()
    takes_references: ClassVar[bool] = True

    # -- checks before anything is built ----------------------------------------------------

    @classmethod
    def architecture(cls, path: str) -> tuple[dict, dict] | None:
        return architecture_configs(path)

    @classmethod
    def check_image_size(cls, architecture: tuple[dict, dict], key: str, size: int) -> None:
        _, vae = architecture
        vae_factor = 2 ** (len(vae.get("block_out_channels", (128, 256, 512, 512))) - 1)
        require_size_multiple(
            key,
            size,
            vae_factor * PATCH,
            f"VAE factor {vae_factor} x {PATCH}x{PATCH} packing of FLUX.2",
        )

    @classmethod
    def trainable_from_architecture(cls, architecture: tuple[dict, dict]) -> torch.nn.Module:
        from diffusers import Flux2Transformer2DModel

        return model_from_config(Flux2Transformer2DModel, architecture[0])

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Also refuse CFG on a step-distilled checkpoint (read from its ``model_index.json``
        without weights) before anything is built."""
        super().check_config(block, recipe)
        sampling = getattr(recipe, "sampling", None) or {}
        if not isinstance(sampling, dict):
            return
        try:
            distilled = source_is_distilled(cls._path_of(block))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc
        if not distilled:
            return
        for key in ("guidance_scale", "eval_guidance_scale"):
            scale = sampling.get(key)
            if isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 1.0:
                raise ConfigError(
                    f"sampling.{key}={scale} but {cls._path_of(block)} is step-distilled "
                    "(is_distilled in its model_index.json): it samples without classifier-free "
                    f"guidance; set sampling.{key}=1 or use a base (undistilled) checkpoint"
                )

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
        self.is_distilled = bool(parts["is_distilled"])
        if not self.is_distilled:
            self.guidance = SeparateCFG()  # type: ignore[misc]
        # the pipeline hands the scheduler linspace(1, 1/T, T) pre-shift σ and its own μ
        # (FLUX.2's empirical fit in image tokens and steps)
        self.scheduler_config: ConfigDict = {
            **parts["scheduler_config"],
            "sigma_spacing": "linspace",
            "mu_policy": "flux2_empirical",
        }

        # Geometry, read once before anyone wraps the transformer.
        vcfg = self.vae.config
        self.latent_channels = int(vcfg.latent_channels)
        self.vae_scale_factor = 2 ** (len(vcfg.block_out_channels) - 1)
        self.packed_channels = int(self.transformer.config.in_channels)
        self.check_packing(self.latent_channels)
        self.batch_norm_eps = float(vcfg.batch_norm_eps)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)
        self.text_layers = pipeline_text_layers()
        text_cfg = self.text_encoder.config
        depth, width = int(text_cfg.num_hidden_layers), int(text_cfg.hidden_size)
        joint = int(self.transformer.config.joint_attention_dim)
        if max(self.text_layers) > depth or joint != len(self.text_layers) * width:
            raise ValueError(
                f"the text encoder ({depth} layers of width {width}) cannot feed the transformer: "
                f"the pipeline stacks hidden states {self.text_layers} into "
                f"joint_attention_dim={joint}"
            )
        self._position_ids: dict[PositionKey, torch.Tensor] = {}

    # -- encode --------------------------------------------------------------------------------

    def encode_unique(self, texts: list[str]) -> Flux2KleinConditions:
        embeds = encode_klein_prompts(
            self.tokenizer,
            self.text_encoder,
            texts,
            max_sequence_length=self.config.max_sequence_length,
            layers=self.text_layers,
        )
        return Flux2KleinConditions(prompt_embeds=embeds.to(self.device))

    def with_negative(  # type: ignore[override]
        self, conditions: Flux2KleinConditions, negative: Flux2KleinConditions
    ) -> Flux2KleinConditions:
        return dataclasses.replace(
            conditions,
            negative_prompt_embeds=negative.prompt_embeds.expand(len(conditions), -1, -1),
        )

    def encode_references(  # type: ignore[override]
        self, conditions: Flux2KleinConditions, pixels: torch.Tensor
    ) -> Flux2KleinConditions:
        """``conditions`` with row ``i`` conditioned on ``pixels[i]`` (``[N, 3, H, W]`` float32
        in [0, 1], ``H`` and ``W`` multiples of 16, at most 1024² pixels): each distinct image
        is VAE-encoded once (the distribution's mode), patchified, normalised with the VAE's
        batch-norm statistics and packed, as ``Flux2KleinPipeline`` prepares one reference
        image; its tokens sit at time 10. Rows with equal images share one encoding."""
        self._require_onloaded("encode_references")
        n = len(conditions)
        if pixels.ndim != 4 or pixels.shape[0] != n or pixels.shape[1] != 3:
            raise ValueError(
                f"encode_references: pixels must be [N={n}, 3, H, W] (one reference per row), "
                f"got {tuple(pixels.shape)}"
            )
        height, width = int(pixels.shape[2]), int(pixels.shape[3])
        multiple = self.vae_scale_factor * PATCH
        if height % multiple or width % multiple or height * width > MAX_REFERENCE_PIXELS:
            raise ValueError(
                f"encode_references: reference images of {height}x{width} pixels; FLUX.2 takes "
                f"multiples of {multiple} of at most {MAX_REFERENCE_PIXELS} pixels (resize the "
                "references to the sampling height x width)"
            )
        low, high = float(pixels.min()), float(pixels.max())
        if not (low >= 0.0 and high <= 1.0):
            raise ValueError(
                f"encode_references: pixels must be in [0, 1], got [{low:.3g}, {high:.3g}]"
            )
        unique: list[torch.Tensor] = []
        index: list[int] = []
        for row in pixels:
            match = next((j for j, u in enumerate(unique) if torch.equal(u, row)), None)
            if match is None:
                unique.append(row)
                match = len(unique) - 1
            index.append(match)
        with torch.no_grad():
            encoded = torch.cat([self._encode_reference(u[None]) for u in unique])
        grid = grid_position_ids(REFERENCE_TIME, height // multiple, width // multiple)
        return dataclasses.replace(
            conditions,
            reference_latents=encoded[torch.tensor(index, device=encoded.device)],
            reference_ids=grid.expand(n, -1, -1),
        )

    def _encode_reference(self, image: torch.Tensor) -> torch.Tensor:
        """``[1, R, 4·C]``: one image ``[1, 3, H, W]`` in [0, 1] as reference tokens."""
        x = (2.0 * image.float() - 1.0).to(self.device, self.vae_dtype)
        z = patchify(self.vae.encode(x).latent_dist.mode())
        mean, std = self._latent_statistics(z.dtype)
        z = (z - mean) / std
        return z.permute(0, 2, 3, 1).reshape(1, -1, z.shape[1])

    def _latent_statistics(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's batch-norm mean and std per packed channel, ``[1, 4·C, 1, 1]``."""
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.batch_norm_eps)
        return mean.to(dtype), std.to(dtype)

    # -- velocity ------------------------------------------------------------------------------

    def _ids(self, key: PositionKey, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Position ids built once per shape and device (no host copies in the loop)."""
        ids = self._position_ids.get(key)
        if ids is None:
            ids = self._position_ids[key] = build().to(self.device)
        return ids

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor | float, conditions: Flux2KleinConditions
    ) -> torch.Tensor:
        """``v[B, h, w, 4·C]`` (fp32) for packed ``latents[B, h, w, 4·C]`` at ``sigma`` (``[B]``
        or scalar), with the prompt rows of ``conditions`` (``B`` rows).

        As diffusers calls it: ``timestep = σ·num_train_timesteps`` in the latents' dtype,
        divided by 1000; image positions ``(0, row, col, 0)``, text ``(0, 0, 0, l)``; a row's
        reference tokens are appended after the image tokens (positions at time 10) and only
        the generated tokens' velocity is returned.
        """
        b, grid_h, grid_w, channels = latents.shape
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=latents.device)
        timestep = (sigma_t * self.num_train_timesteps).to(self.device, self.dtype) / 1000
        tokens = grid_h * grid_w
        hidden = latents.to(self.device, self.dtype).reshape(b, tokens, channels)
        img_ids = self._ids(
            ("image", grid_h, grid_w, self.device), lambda: grid_position_ids(0, grid_h, grid_w)
        )
        if conditions.reference_latents is not None and conditions.reference_ids is not None:
            reference = conditions.reference_latents.to(self.device, self.dtype)
            hidden = torch.cat([hidden, reference], dim=1)
            img_ids = torch.cat([img_ids, host_to_device(conditions.reference_ids[0], self.device)])
        text = conditions.prompt_embeds
        txt_ids = self._ids(
            ("text", text.shape[1], self.device), lambda: text_position_ids(text.shape[1])
        )
        with self.sdpa_context(), self.autocast():
            v = self.transformer(
                hidden_states=hidden,
                encoder_hidden_states=text.to(self.device, self.dtype),
                timestep=timestep,
                img_ids=img_ids,
                txt_ids=txt_ids,
                guidance=None,
                return_dict=False,
            )[0]
        return v[:, :tokens].float().reshape(b, grid_h, grid_w, channels)

    # -- geometry and decode ------------------------------------------------------------------

    def unpack(self, latents: torch.Tensor) -> torch.Tensor:
        """Packed, normalised ``[B, h, w, 4·C]`` -> the VAE's latent ``[B, C, 2h, 2w]`` (the
        batch-norm statistics undone in the VAE's dtype, as diffusers does before decode)."""
        z = latents.to(self.device).permute(0, 3, 1, 2).to(self.vae_dtype)
        mean, std = self._latent_statistics(z.dtype)
        return unpatchify(z * std + mean)

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` float32 in [0, 1]."""
        image = self.vae.decode(self.unpack(latents), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)
