"""``SD3Bundle``: the SD3 / SD3.5 modules (trainable MMDiT + frozen VAE and text encoders)
and the four things the shared denoise loop needs from a family: encode, velocity, latent
geometry, decode."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from unirl.config.precision import parse_dtype
from unirl.config.require import ConfigError, require
from unirl.config.typecheck import PositiveInt
from unirl.models.sd3.arch import SD3ArchSpec, build_arch_modules
from unirl.models.sd3.attention import install_fused_attention
from unirl.models.sd3.conditions import SD3Conditions
from unirl.models.sd3.config import SD3BundleConfig
from unirl.models.sd3.presets import ModelSourceError, architecture_configs, resolve_model_source
from unirl.models.sd3.progress import hf_progress_bars_disabled
from unirl.models.sd3.text_encode import SD3TextStack, encode_sd3_prompts, unique_with_index

_FROZEN = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")


def _sdpa_context(backend: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The attention kernel choice for one transformer call (see ``SD3BundleConfig``)."""
    if backend == "torch" or device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "auto":
        if torch.cuda.get_device_capability(device) < (9, 0):
            return contextlib.nullcontext()
        # Hopper: cuDNN's fused attention first (1.3-1.5x flash at SD3.5-M shapes, see
        # docs/performance.md); each backend still falls through when it cannot take the inputs
        order = [
            SDPBackend.CUDNN_ATTENTION,
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH,
        ]
        return sdpa_kernel(order, set_priority=True)
    kernel = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    return sdpa_kernel(kernel)


def _load_folder(folder: Path, cfg: SD3BundleConfig) -> dict[str, Any]:
    """Components of a diffusers SD3 folder (``save_pretrained`` layout), on CPU, cast."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

    te_dtype = parse_dtype(cfg.text_encoder_dtype, "bundle.text_encoder_dtype")
    common = {"local_files_only": True}
    out: dict[str, Any] = {
        "transformer": SD3Transformer2DModel.from_pretrained(
            folder,
            subfolder="transformer",
            torch_dtype=parse_dtype(cfg.dtype, "bundle.dtype"),
            **common,
        ),
        "vae": AutoencoderKL.from_pretrained(
            folder,
            subfolder="vae",
            torch_dtype=parse_dtype(cfg.vae_dtype, "bundle.vae_dtype"),
            **common,
        ),
        "text_encoder": CLIPTextModelWithProjection.from_pretrained(
            folder, subfolder="text_encoder", dtype=te_dtype, **common
        ),
        "text_encoder_2": CLIPTextModelWithProjection.from_pretrained(
            folder, subfolder="text_encoder_2", dtype=te_dtype, **common
        ),
        "text_encoder_3": None,
        "tokenizer": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer", **common),
        "tokenizer_2": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer_2", **common),
        "tokenizer_3": None,
        "scheduler_config": json.loads(
            (folder / "scheduler" / "scheduler_config.json").read_text()
        ),
    }
    if not cfg.skip_t5:
        out["text_encoder_3"] = T5EncoderModel.from_pretrained(
            folder, subfolder="text_encoder_3", dtype=te_dtype, **common
        )
        out["tokenizer_3"] = AutoTokenizer.from_pretrained(
            folder, subfolder="tokenizer_3", **common
        )
    return out


class SD3Bundle:
    """SD3 / SD3.5 weights for rollout and training.

    Keyword arguments are the fields of :class:`SD3BundleConfig` (so a recipe block
    ``{_target_: unirl.models.sd3.SD3Bundle, path: tiny, dtype: bf16}`` builds it).
    ``self.transformer`` is the trainable module; wrappers (peft, FSDP) may replace the
    attribute and every method goes through it.
    """

    config_class: ClassVar[type[SD3BundleConfig]] = SD3BundleConfig
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

    # -- checks before anything is built (dry_run and the driver's validators) -------------

    @classmethod
    def check_config(cls, block: dict[str, Any], recipe: Any) -> None:
        """Refuse a model path that resolves to nothing and image sizes this architecture
        cannot take, reading configs only (no weights, no download)."""
        try:
            configs = architecture_configs(str(block.get("path", "tiny")))
        except ModelSourceError as exc:
            raise ConfigError(f"bundle.path: {exc}") from exc
        sampling = getattr(recipe, "sampling", None) or {}
        if configs is None or not isinstance(sampling, dict):
            return
        transformer, vae = configs
        patch = int(transformer.get("patch_size", 2))
        multiple = 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1) * patch
        max_patches = transformer.get("pos_embed_max_size")
        for key in ("height", "width"):
            size = sampling.get(key)
            if not isinstance(size, int) or isinstance(size, bool):
                continue
            require(
                size % multiple == 0,
                f"sampling.{key}={size} is not a multiple of {multiple} (VAE factor x patch size "
                f"of this SD3 model); use {max(multiple, size // multiple * multiple)} or "
                f"{(size // multiple + 1) * multiple}",
            )
            if max_patches is not None:
                largest = int(max_patches) * multiple
                require(
                    size <= largest,
                    f"sampling.{key}={size} is larger than this model's position embedding allows "
                    f"(pos_embed_max_size={max_patches} patches, at most {largest} pixels)",
                )

    @classmethod
    def trainable_on_meta(cls, block: dict[str, Any]) -> torch.nn.Module | None:
        """The trainable transformer built on the meta device from its config (module names
        for LoRA target checks, no memory); None when the config is not readable here."""
        try:
            configs = architecture_configs(str(block.get("path", "tiny")))
        except ModelSourceError:
            return None
        if configs is None:
            return None
        from diffusers import SD3Transformer2DModel

        config = {k: v for k, v in configs[0].items() if not k.startswith("_")}
        with torch.device("meta"):
            return SD3Transformer2DModel.from_config(config)

    def __init__(
        self,
        *,
        path: str = "tiny",
        dtype: str = "bf16",
        text_encoder_dtype: str = "bf16",
        vae_dtype: str = "fp32",
        device: str = "auto",
        max_sequence_length: PositiveInt = 256,
        skip_t5: bool = False,
        t5_placeholder: str = "zeros",
        negative_prompt: str = "",
        gradient_checkpointing: bool = False,
        sdpa_backend: str = "auto",
        decode_chunk_size: PositiveInt = 8,
        compile_vae: bool = False,
        fuse_projections: bool = True,
    ) -> None:
        self.config = SD3BundleConfig(
            path=path,
            dtype=dtype,
            text_encoder_dtype=text_encoder_dtype,
            vae_dtype=vae_dtype,
            device=device,
            max_sequence_length=max_sequence_length,
            skip_t5=skip_t5,
            t5_placeholder=t5_placeholder,
            negative_prompt=negative_prompt,
            gradient_checkpointing=gradient_checkpointing,
            sdpa_backend=sdpa_backend,
            decode_chunk_size=decode_chunk_size,
            compile_vae=compile_vae,
            fuse_projections=fuse_projections,
        )
        cfg = self.config
        self.device = cfg.resolved_device()
        self.dtype = parse_dtype(cfg.dtype, "bundle.dtype")
        self.text_encoder_dtype = parse_dtype(cfg.text_encoder_dtype, "bundle.text_encoder_dtype")
        self.vae_dtype = parse_dtype(cfg.vae_dtype, "bundle.vae_dtype")
        self.source = resolve_model_source(cfg.path)
        if isinstance(self.source, SD3ArchSpec):
            parts = build_arch_modules(
                self.source,
                device=self.device,
                dtype=self.dtype,
                text_encoder_dtype=self.text_encoder_dtype,
                vae_dtype=self.vae_dtype,
                build_t5=not cfg.skip_t5,
            )
        else:
            with hf_progress_bars_disabled():
                parts = _load_folder(self.source, cfg)

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
        self.scheduler_config: dict[str, Any] = dict(parts["scheduler_config"])

        # Read geometry once, before anyone wraps the transformer.
        tcfg = self.transformer.config
        self.latent_channels = int(tcfg.in_channels)
        self.patch_size = int(tcfg.patch_size)
        self.joint_attention_dim = int(tcfg.joint_attention_dim)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.scaling_factor = float(self.vae.config.scaling_factor)
        self.shift_factor = float(self.vae.config.shift_factor or 0.0)
        self.num_train_timesteps = int(self.scheduler_config.get("num_train_timesteps", 1000))

        for name in _FROZEN:
            module = getattr(self, name)
            if module is not None:
                module.requires_grad_(False).eval()
        self.transformer.eval()
        if cfg.fuse_projections:
            install_fused_attention(self.transformer)
        if cfg.gradient_checkpointing:
            self.transformer.enable_gradient_checkpointing()
        self._negative_cache: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._offloaded = False
        self.to(self.device)
        if cfg.compile_vae:  # compiled lazily on the first decode, one graph per chunk shape
            self.vae.decoder.compile(dynamic=False)

    @classmethod
    def from_config(cls, config: SD3BundleConfig) -> SD3Bundle:
        return cls(**{f: getattr(config, f) for f in config.__dataclass_fields__})

    # -- modules -------------------------------------------------------------------------------

    @property
    def trainable_module(self) -> torch.nn.Module:
        return self.transformer

    def to(self, device: torch.device | str) -> SD3Bundle:
        """Move every module to ``device`` (and make it the bundle's device)."""
        self.device = torch.device(device)
        self.transformer.to(self.device)
        for name in _FROZEN:
            module = getattr(self, name)
            if module is not None:
                module.to(self.device)
        self._negative_cache.clear()
        self._offloaded = False
        return self

    def offload(self) -> None:
        """Park the frozen parts (text encoders, VAE) on CPU to free device memory."""
        for name in _FROZEN:
            module = getattr(self, name)
            if module is not None:
                module.to("cpu")
        self._offloaded = True

    def onload(self) -> None:
        """Bring the frozen parts back to the bundle's device."""
        for name in _FROZEN:
            module = getattr(self, name)
            if module is not None:
                module.to(self.device)
        self._offloaded = False

    def _require_onloaded(self, what: str) -> None:
        if self._offloaded:
            raise RuntimeError(
                f"SD3Bundle.{what}: the frozen modules are offloaded to CPU; call onload() first"
            )

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

    def _encode_unique(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, pooled = encode_sd3_prompts(
            self._text_stack(),
            texts,
            max_sequence_length=self.config.max_sequence_length,
            t5_placeholder=self.config.t5_placeholder,
        )
        return embeds.to(self.device), pooled.to(self.device)

    def negative_embeds(
        self, negative_prompt: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeds[1, L, D], pooled[1, Dp])`` of the negative prompt, encoded once and cached."""
        self._require_onloaded("negative_embeds")
        text = self.config.negative_prompt if negative_prompt is None else negative_prompt
        key = (text, self.config.max_sequence_length)
        if key not in self._negative_cache:
            self._negative_cache[key] = self._encode_unique([text])
        return self._negative_cache[key]

    def encode_prompts(
        self,
        texts: list[str],
        *,
        negative: bool = False,
        negative_prompt: str | None = None,
        samples_per_prompt: int = 1,
    ) -> SD3Conditions:
        """Conditions with ``len(texts) * samples_per_prompt`` rows (each text repeated in place).

        Each unique text is encoded once and its row shared by every copy, so a group's
        samples see bit-identical embeddings. With ``negative=True`` (or a ``negative_prompt``)
        the negative fields hold the cached encoding of ``negative_prompt`` (default: the
        config's, usually ``""``), broadcast to every row.
        """
        self._require_onloaded("encode_prompts")
        if isinstance(texts, str):
            raise TypeError("SD3Bundle.encode_prompts takes a list of texts, not a single string")
        if not texts:
            raise ValueError("SD3Bundle.encode_prompts: empty list of texts")
        if samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt={samples_per_prompt} must be >= 1")
        unique, index = unique_with_index(list(texts))
        embeds, pooled = self._encode_unique(unique)
        index = index.repeat_interleave(samples_per_prompt).to(self.device)
        embeds, pooled = embeds.index_select(0, index), pooled.index_select(0, index)
        neg_embeds = neg_pooled = None
        if negative or negative_prompt is not None:
            ne, npool = self.negative_embeds(negative_prompt)
            n = embeds.shape[0]
            neg_embeds, neg_pooled = ne.expand(n, -1, -1), npool.expand(n, -1)
        return SD3Conditions(
            prompt_embeds=embeds,
            pooled_prompt_embeds=pooled,
            negative_prompt_embeds=neg_embeds,
            negative_pooled_prompt_embeds=neg_pooled,
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
        b = latents.shape[0]
        if len(conditions) != b:
            raise ValueError(f"predict_velocity: {b} latents but {len(conditions)} condition rows")
        sigma_t = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1)
        if sigma_t.numel() == 1:
            sigma_t = sigma_t.expand(b)
        elif sigma_t.numel() != b:
            raise ValueError(
                f"predict_velocity: sigma has {sigma_t.numel()} values for {b} latents"
            )
        timestep = (sigma_t * self.num_train_timesteps).to(self.device)
        # On accelerators, autocast runs every matmul (the fp32 LoRA master weights included)
        # in the bundle's dtype; on CPU, and in fp32, the math is exactly the module's own.
        autocast = torch.autocast(
            device_type=self.device.type,
            dtype=self.dtype,
            enabled=self.device.type == "cuda" and self.dtype != torch.float32,
        )
        with _sdpa_context(self.config.sdpa_backend, self.device), autocast:
            v = self.transformer(
                hidden_states=latents.to(self.device, self.dtype),
                encoder_hidden_states=conditions.prompt_embeds.to(self.device, self.dtype),
                pooled_projections=conditions.pooled_prompt_embeds.to(self.device, self.dtype),
                timestep=timestep,
                return_dict=False,
            )[0]
        return v.float()

    # -- geometry and decode ------------------------------------------------------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """``(C, h, w)`` of the latent of a ``height x width`` image (multiples of 16 for SD3)."""
        multiple = self.vae_scale_factor * self.patch_size
        if height % multiple or width % multiple or height <= 0 or width <= 0:
            raise ValueError(
                f"sampling.height={height} and sampling.width={width} must be positive multiples of "
                f"{multiple} (VAE factor {self.vae_scale_factor} x patch {self.patch_size})"
            )
        return (
            self.latent_channels,
            height // self.vae_scale_factor,
            width // self.vae_scale_factor,
        )

    def image_seq_len(self, height: int, width: int) -> int:
        """Number of image tokens the transformer sees (for resolution-dependent σ shifts)."""
        _, h, w = self.latent_shape(height, width)
        return (h // self.patch_size) * (w // self.patch_size)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` float32 in [0, 1] from model-space ``latents[B, C, h, w]``.

        Unscales as diffusers does (``latents / scaling_factor + shift_factor``) and decodes
        ``decode_chunk_size`` latents per VAE call. Respects the caller's grad mode.
        """
        self._require_onloaded("decode")
        chunk = self.config.decode_chunk_size
        out = []
        for start in range(0, latents.shape[0], chunk):
            z = latents[start : start + chunk].to(self.device, torch.float32)
            z = z / self.scaling_factor + self.shift_factor
            image = self.vae.decode(z.to(self.vae_dtype), return_dict=False)[0]
            out.append((image.float() / 2 + 0.5).clamp(0, 1))
        return torch.cat(out)
