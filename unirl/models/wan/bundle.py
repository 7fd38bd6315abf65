"""``WanBundle``: the Wan modules (one or two trainable ``WanTransformer3DModel`` experts, the
frozen UMT5 text encoder, the 3D causal VAE, for I2V the CLIP image encoder) and Wan's own part
of the family contract: loading, prompt and first-frame encoding, the velocity call with the
expert of each σ, the static-shift σ policy, video latent geometry and decode. The rest is
:class:`~unirl.models.common.bundle.FlowMatchingBundle`'s.

Latents are the VAE's own ``[N, 16, F, H/8, W/8]`` with ``F = (num_frames - 1) / 4 + 1`` (the
first pixel frame is a latent frame of its own, then every 4 frames one more), normalised
with the VAE's per-channel ``latents_mean`` / ``latents_std``. The transformer patches them
(1, 2, 2) itself. Guidance is batched CFG (``[negative; prompt]`` rows in one forward): every
prompt is padded to ``max_sequence_length`` tokens, so the rows stack.

Two experts (Wan 2.2): ``transformer`` runs where ``σ ≥ boundary_ratio`` (diffusers compares
``t = σ·1000`` with ``boundary_ratio·1000``), ``transformer_2`` below. ``train_experts`` says
which train; :attr:`trainable_attr` is where the training backend finds them (``transformer``,
``transformer_2``, or ``experts``, a :class:`~unirl.models.wan.experts.WanExperts` holding
both).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from unirl.config.require import ConfigError, require
from unirl.models.common.bundle import FlowMatchingBundle, require_size_multiple
from unirl.models.common.config_dict import ConfigDict, config_int
from unirl.models.common.engine_maps import EngineMaps
from unirl.models.common.geometry import (
    VideoGrid,
    VideoLatentGeometry,
    sigma_per_sample,
    video_pixels,
)
from unirl.models.common.presets import ModelSourceError
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.wan.arch import WanArchSpec, build_arch_modules
from unirl.models.wan.conditions import WanConditions
from unirl.models.wan.config import (
    WAN_VAE,
    WanBundleConfig,
    check_expert_choice,
    check_num_frames,
    check_text_tokens,
    trainable_attr_for,
)
from unirl.models.wan.engine_maps import WanEngineMaps
from unirl.models.wan.experts import WanExperts, split_expert_lora
from unirl.models.wan.presets import (
    architecture_configs,
    expert_layout,
    load_folder,
    resolve_model_source,
    scheduler_config_of,
)
from unirl.models.wan.text_encode import (
    encode_clip_images,
    encode_first_frame,
    encode_umt5_prompts,
)

PATCH = 2  # the transformer's spatial patch (its temporal patch is 1)


class WanBundle(VideoLatentGeometry, FlowMatchingBundle):
    """Wan 2.1 / 2.2 weights for rollout and training.

    Keyword arguments are the fields of :class:`WanBundleConfig` (a recipe block
    ``{_target_: unirl.models.wan.WanBundle, path: Wan-AI/Wan2.1-T2V-1.3B-Diffusers, dtype: bf16}``
    builds it); ``WanBundle.from_config(config)`` takes a config whole. The trained module is
    ``getattr(bundle, bundle.trainable_attr)``.
    """

    config_class: ClassVar[type[WanBundleConfig]] = WanBundleConfig
    config: WanBundleConfig
    frozen_module_names: ClassVar[tuple[str, ...]] = ("text_encoder", "vae", "image_encoder")
    block_class_names: ClassVar[tuple[str, ...]] = ("WanTransformerBlock",)
    # self- and cross-attention of every block (attn1 / attn2)
    lora_default_targets: ClassVar[tuple[str, ...]] = ("to_q", "to_k", "to_v", "to_out.0")
    # vLLM-Omni's dialect of this family (engine_maps.py; text-to-video)
    engine_maps: ClassVar[EngineMaps | None] = WanEngineMaps()
    video_vae: ClassVar[str] = WAN_VAE
    patch = PATCH  # VideoLatentGeometry's spatial patch
    # I2V models attach a first frame per row; a text-to-video model refuses it in one line
    takes_references: ClassVar[bool] = True

    # -- checks before anything is built ----------------------------------------------------

    @classmethod
    def architecture(cls, path: str) -> tuple[dict, dict] | None:
        return architecture_configs(path)

    @classmethod
    def requires_references(cls, block: Mapping[str, object]) -> bool:
        """True when ``block.path`` is an image-to-video model (its transformer reads more
        channels than the VAE writes: noise, mask and first frame), read from its configs; such
        a model needs a first frame for every prompt (checked before Ray by the trainer)."""
        try:
            architecture = cls.architecture(cls._path_of(block))
        except ModelSourceError:
            return False  # the path's own line comes from check_config
        if architecture is None:
            return False
        transformer, vae = architecture
        return int(transformer.get("in_channels", 16)) != int(vae.get("z_dim", 16))

    @classmethod
    def video_grid(cls, architecture: tuple[dict, dict]) -> VideoGrid:
        transformer, vae = architecture
        downsample = vae.get("temperal_downsample", (False, True, True))
        patch_t, patch, _ = (int(p) for p in transformer.get("patch_size", (1, PATCH, PATCH)))
        return VideoGrid(
            spatial=2 ** len(downsample),
            temporal=2 ** sum(bool(d) for d in downsample),
            patch_t=patch_t,
            patch=patch,
        )

    @classmethod
    def check_image_size(cls, architecture: tuple[dict, dict], key: str, size: int) -> None:
        grid = cls.video_grid(architecture)
        require_size_multiple(
            key,
            size,
            grid.spatial * grid.patch,
            f"VAE factor {grid.spatial} x {grid.patch}x{grid.patch} patches of Wan",
        )

    @classmethod
    def trainable_from_architecture(cls, architecture: tuple[dict, dict]) -> torch.nn.Module:
        from diffusers import WanTransformer3DModel

        config = {k: v for k, v in architecture[0].items() if not k.startswith("_")}
        return WanTransformer3DModel.from_config(config)

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """The shared checks, then Wan's: ``num_frames`` of the form 4k + 1, experts that exist,
        and ``backend.trainable_attr`` naming where the trained experts live."""
        super().check_config(block, recipe)
        sampling = getattr(recipe, "sampling", None) or {}
        frames = sampling.get("num_frames") if isinstance(sampling, dict) else None
        if isinstance(frames, int) and not isinstance(frames, bool):
            check_num_frames(frames, 4)
        try:
            architecture = cls.architecture(cls._path_of(block))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc
        tokens = block.get("max_sequence_length", WanBundleConfig.max_sequence_length)
        if architecture is not None and isinstance(tokens, int):
            check_text_tokens(architecture[0].get("image_dim") is not None, tokens)
        try:
            layout = expert_layout(cls._path_of(block))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc
        if layout is None:
            return
        two, _ = layout
        train = str(block.get("train_experts", "both"))
        check_expert_choice(two, train, block.get("boundary_ratio"))
        backend = getattr(recipe, "backend", None) or {}
        got = backend.get("trainable_attr") if isinstance(backend, dict) else None
        if got is not None:  # null / absent: the backend takes bundle.trainable_attr itself
            wanted = trainable_attr_for(train, two)
            require(
                str(got) == wanted,
                f"backend.trainable_attr={got!r} but bundle.train_experts={train} trains "
                f"bundle.{wanted}; set backend.trainable_attr: {wanted} (or drop it: the "
                "backend defaults to the bundle's)",
            )

    # -- modules -------------------------------------------------------------------------------

    def load(self) -> None:
        cfg = self.config
        self.source = resolve_model_source(cfg.path)
        if isinstance(self.source, WanArchSpec):
            parts = build_arch_modules(
                self.source,
                device=self.device,
                dtype=self.dtype,
                text_encoder_dtype=self.text_encoder_dtype,
                vae_dtype=self.vae_dtype,
            )
        else:
            with hf_progress_bars_disabled():
                parts = load_folder(self.source, cfg)
        two = parts["transformer_2"] is not None
        check_expert_choice(two, cfg.train_experts, cfg.boundary_ratio)
        self.experts = WanExperts(parts["transformer"], parts["transformer_2"])
        self.vae: torch.nn.Module = parts["vae"]
        self.text_encoder: torch.nn.Module = parts["text_encoder"]
        self.image_encoder: torch.nn.Module | None = parts["image_encoder"]
        self.image_processor = parts["image_processor"]
        self.tokenizer = parts["tokenizer"]
        scheduler = scheduler_config_of(dict(parts["scheduler_config"]))
        if cfg.flow_shift is not None:
            scheduler["shift"] = float(cfg.flow_shift)
        self.scheduler_config: ConfigDict = scheduler

        # Experts: which runs where, which trains, where the backend finds what trains.
        self.two_experts = two
        ratio = cfg.boundary_ratio if cfg.boundary_ratio is not None else parts["boundary_ratio"]
        require(
            not two or ratio is not None,
            f"bundle.path={cfg.path!r} has two experts but no boundary_ratio in its "
            "model_index.json; set bundle.boundary_ratio",
        )
        self.boundary_ratio: float | None = float(ratio) if two else None
        self.trainable_attr = trainable_attr_for(cfg.train_experts, two)
        self.trainable_module_names = (self.trainable_attr,)  # type: ignore[misc]
        trained = (
            {"transformer"}
            if not two
            else {"both": {"transformer", "transformer_2"}, "high": {"transformer"}}.get(
                cfg.train_experts, {"transformer_2"}
            )
        )
        self.trained_experts: tuple[str, ...] = tuple(
            n for n in ("transformer", "transformer_2") if n in trained
        )
        for name, module in self.experts.experts().items():
            if name not in trained:
                module.requires_grad_(False).eval()

        # Geometry, read once before anyone wraps the transformers.
        tcfg = parts["transformer"].config
        vcfg = self.vae.config
        self.latent_channels = int(vcfg.z_dim)
        self.in_channels = int(tcfg.in_channels)
        self.is_i2v = self.in_channels != self.latent_channels
        require(
            not self.is_i2v or self.in_channels == 2 * self.latent_channels + 4,
            f"transformer in_channels={self.in_channels} is neither the VAE's {self.latent_channels} "
            f"latent channels (T2V) nor 2·{self.latent_channels} + 4 (I2V: noise, mask, first frame)",
        )
        self.uses_image_embeds = tcfg.image_dim is not None
        check_text_tokens(self.uses_image_embeds, cfg.max_sequence_length)
        require(
            not self.uses_image_embeds or self.image_encoder is not None,
            f"bundle.path={cfg.path!r}: the transformer takes CLIP image tokens (image_dim set) "
            "but the checkpoint has no image_encoder",
        )
        self.temporal_factor = int(getattr(vcfg, "scale_factor_temporal", 4) or 4)
        self.spatial_factor = int(getattr(vcfg, "scale_factor_spatial", 8) or 8)
        self.num_train_timesteps = config_int(self.scheduler_config, "num_train_timesteps", 1000)
        self.boundary_timestep = (
            None if self.boundary_ratio is None else self.boundary_ratio * self.num_train_timesteps
        )
        shape = (1, self.latent_channels, 1, 1, 1)
        self._latents_mean = torch.tensor(vcfg.latents_mean).view(shape)
        self._latents_std = torch.tensor(vcfg.latents_std).view(shape)

    # the experts, always read through the container (wrappers may replace them there)

    @property
    def transformer(self) -> torch.nn.Module:
        """The (high-noise) expert."""
        return self.experts.transformer

    @transformer.setter
    def transformer(self, module: torch.nn.Module) -> None:
        self._set_expert("transformer", module)

    @property
    def transformer_2(self) -> torch.nn.Module | None:
        """The low-noise expert (Wan 2.2), None for one-expert models."""
        return self.experts.transformer_2

    @transformer_2.setter
    def transformer_2(self, module: torch.nn.Module) -> None:
        self._set_expert("transformer_2", module)

    def _set_expert(self, name: str, module: torch.nn.Module) -> None:
        if isinstance(module, WanExperts):
            raise ValueError(
                f"bundle.{name} was set to both experts: bundle.train_experts="
                f"{self.config.train_experts} trains bundle.{self.trainable_attr}; set "
                f"backend.trainable_attr: {self.trainable_attr}"
            )
        setattr(self.experts, name, module)

    @property
    def trainable_module(self) -> torch.nn.Module:
        """What the training backend wraps: the trained expert, or both as ``experts``."""
        return getattr(self, self.trainable_attr)

    @property
    def trainable_modules(self) -> dict[str, torch.nn.Module]:
        """The trained experts by diffusers' component name (``transformer``, ``transformer_2``)."""
        return {name: getattr(self.experts, name) for name in self.trained_experts}

    @property
    def frozen_experts(self) -> dict[str, torch.nn.Module]:
        """The experts that do not train (kept on the device: sampling needs them)."""
        return {n: m for n, m in self.experts.experts().items() if n not in self.trained_experts}

    def to(self, device: torch.device | str) -> Self:
        super().to(device)
        for module in self.frozen_experts.values():
            module.to(self.device)
        return self

    def postprocess_lora_export(self, folder: Path) -> None:
        """Both experts trained (``trainable_attr == "experts"``): split the export into
        ``folder/transformer`` and ``folder/transformer_2``, the diffusers LoRA of each expert
        (:func:`~unirl.models.wan.experts.split_expert_lora`); the combined file stays. One
        trained expert exports diffusers' form as written (``transformer_2``: load it with
        ``load_into_transformer_2=True``)."""
        if self.trainable_attr == "experts":
            split_expert_lora(folder)

    # -- encode --------------------------------------------------------------------------------

    def encode_unique(self, texts: list[str]) -> WanConditions:
        embeds = encode_umt5_prompts(
            self.tokenizer,
            self.text_encoder,
            texts,
            max_sequence_length=self.config.max_sequence_length,
        )
        return WanConditions(prompt_embeds=embeds.to(self.device))

    def with_negative(  # type: ignore[override]
        self, conditions: WanConditions, negative: WanConditions
    ) -> WanConditions:
        return WanConditions(
            prompt_embeds=conditions.prompt_embeds,
            negative_prompt_embeds=negative.prompt_embeds.expand(len(conditions), -1, -1),
            image_condition=conditions.image_condition,
            image_embeds=conditions.image_embeds,
            video_shape=conditions.video_shape,
        )

    def cfg_conditions(self, conditions: WanConditions) -> WanConditions:
        """``[negative rows; prompt rows]`` (2·N) for one batched CFG forward."""
        return conditions.cfg_pairs()

    def encode_references(  # type: ignore[override]
        self, conditions: WanConditions, pixels: torch.Tensor
    ) -> WanConditions:
        """I2V: ``conditions`` with the first frame of each row attached, ``pixels[N, 3, H, W]``
        in [0, 1] (the video's size; ``conditions.video_shape`` gives frames and size, set by
        :class:`~unirl.models.wan.WanPipeline`)."""
        shape = conditions.video_shape
        if shape is None:
            raise ValueError(
                "WanBundle.encode_references: the conditions carry no video_shape (frames, "
                "height, width); encode through unirl.models.wan.WanPipeline or call "
                "encode_first_frames"
            )
        num_frames, height, width = shape
        return self.encode_first_frames(
            conditions, pixels, num_frames=num_frames, height=height, width=width
        )

    @torch.no_grad()
    def encode_first_frames(
        self,
        conditions: WanConditions,
        pixels: torch.Tensor,
        *,
        num_frames: int,
        height: int,
        width: int,
    ) -> WanConditions:
        """``conditions`` with ``image_condition`` (mask + VAE latent of the first frame and
        ``num_frames - 1`` black frames) and, for models with a CLIP image encoder,
        ``image_embeds`` attached; ``pixels[N, 3, height, width]`` in [0, 1]."""
        self._require_onloaded("encode_first_frames")
        if not self.is_i2v:
            raise ValueError(
                f"bundle.path={self.config.path!r} is a text-to-video Wan model and takes no "
                "first frames, but the prompts carry 'media' references; use an image-to-video "
                "model (path=tiny-i2v, Wan-AI/Wan2.1-I2V-14B-480P-Diffusers) or a prompt file "
                "without 'media'"
            )
        n = len(conditions)
        if pixels.ndim != 4 or pixels.shape[0] != n or pixels.shape[1] != 3:
            raise ValueError(
                f"encode_first_frames: pixels must be [{n}, 3, H, W] (one first frame per row), "
                f"got {tuple(pixels.shape)}"
            )
        if tuple(pixels.shape[2:]) != (height, width):
            raise ValueError(
                f"encode_first_frames: first frames are {tuple(pixels.shape[2:])} but the video "
                f"is {height}x{width}; resize the reference images to sampling.height x "
                "sampling.width"
            )
        check_num_frames(num_frames, self.temporal_factor)
        image_condition = encode_first_frame(
            self.vae,
            pixels.to(self.device),
            num_frames=num_frames,
            latents_mean=self._latents_mean,
            latents_std=self._latents_std,
            temporal_factor=self.temporal_factor,
        ).to(self.device)
        image_embeds = None
        if self.uses_image_embeds:
            assert self.image_encoder is not None
            image_embeds = encode_clip_images(self.image_processor, self.image_encoder, pixels).to(
                self.device
            )
        return conditions.with_images(image_condition, image_embeds)

    # -- velocity ------------------------------------------------------------------------------

    def expert_of(self, timestep: torch.Tensor) -> torch.Tensor:
        """``high[B]`` (bool, on the host): rows the high-noise expert owns, as diffusers picks
        (``t ≥ boundary_ratio·num_train_timesteps``). One device sync for two-expert models."""
        if self.boundary_timestep is None:
            return torch.ones(timestep.shape[0], dtype=torch.bool)
        return (timestep >= self.boundary_timestep).cpu()

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor | float, conditions: WanConditions
    ) -> torch.Tensor:
        """``v[B, C, F, h, w]`` (fp32) for ``latents[B, C, F, h, w]`` at ``sigma`` (``[B]`` or
        scalar), with the rows of ``conditions`` (``B`` rows).

        As diffusers calls it: ``timestep = σ·num_train_timesteps`` (fp32), the latents (and
        the I2V condition, along channels) in the transformer's dtype, the expert of each row's
        σ. Rows of both experts in one batch run as two forwards.
        """
        b = latents.shape[0]
        if len(conditions) != b:
            raise ValueError(f"predict_velocity: {b} latents but {len(conditions)} condition rows")
        if self.is_i2v and conditions.image_condition is None:
            raise ValueError(
                f"bundle.path={self.config.path!r} is an image-to-video model: every prompt "
                "needs a first frame (a prompt file with 'media' references)"
            )
        sigma_t = sigma_per_sample(sigma, latents, conditions, device=latents.device)
        timestep = (sigma_t * self.num_train_timesteps).to(self.device)
        high = self.expert_of(timestep)
        if bool(high.all()) or not bool(high.any()):
            name = "transformer" if bool(high.all()) else "transformer_2"
            return self._expert_forward(name, latents, timestep, conditions)
        rows = {
            "transformer": high.nonzero().squeeze(1),
            "transformer_2": (~high).nonzero().squeeze(1),
        }
        out = torch.empty(latents.shape, dtype=torch.float32, device=self.device)
        for name, idx in rows.items():
            dev_idx = idx.to(self.device)
            out[dev_idx] = self._expert_forward(
                name,
                latents.index_select(0, idx.to(latents.device)),
                timestep.index_select(0, dev_idx),
                conditions.select(idx),
            )
        return out

    def _expert_forward(
        self,
        name: str,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        conditions: WanConditions,
    ) -> torch.Tensor:
        if torch.is_grad_enabled() and name not in self.trained_experts:
            sigma = float(timestep.max()) / self.num_train_timesteps
            side = "≥" if name == "transformer" else "<"
            raise ValueError(
                f"a trained step at σ={sigma:.4g} runs the frozen {name} (σ {side} "
                f"{self.boundary_ratio}; bundle.train_experts={self.config.train_experts}): "
                "keep sampling.sde_steps within the trained expert's σ range"
            )
        if self.trainable_attr == "experts":  # one FSDP root: its forward gathers its parameters
            module: Any = functools.partial(self.experts, name)
        else:
            module = getattr(self.experts, name)
        hidden = latents.to(self.device, self.dtype)
        if conditions.image_condition is not None:
            hidden = torch.cat(
                [hidden, conditions.image_condition.to(self.device, self.dtype)], dim=1
            )
        image_embeds = conditions.image_embeds
        with self.sdpa_context(), self.autocast():
            v = module(
                hidden_states=hidden,
                timestep=timestep,
                encoder_hidden_states=conditions.prompt_embeds.to(self.device, self.dtype),
                encoder_hidden_states_image=None
                if image_embeds is None
                else image_embeds.to(self.device, self.dtype),
                return_dict=False,
            )[0]
        return v.float()

    # -- geometry and decode ------------------------------------------------------------------

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Un-normalises as diffusers does (``z / (1/std) + mean`` in the VAE's dtype) and decodes
        every frame; ``pixels[B, T, 3, H, W]`` float32 in [0, 1]."""
        z = latents.to(self.device, self.vae_dtype)
        inv_std = 1.0 / self._latents_std.to(z.device, torch.float32)
        z = z / inv_std.to(z.dtype) + self._latents_mean.to(z.device, z.dtype)
        video = self.vae.decode(z, return_dict=False)[0]  # [B, 3, T, H, W] in [-1, 1]
        return video_pixels(video)
