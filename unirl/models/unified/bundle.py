"""``TransfusionBundle``: the unified family's modules and both halves of its contract.

The text half is the causal-LM contract of ``unirl.models.common_ar`` (prompt formatting,
stop tokens, sampling mode; ``bundle.model`` is what the backend wraps), inherited from the
Qwen3 family whose tiny backbone this family builds on. The image half is what the shared
flow-matching loop (``unirl.models.common.denoise``) asks of a family: σ policy, latent
shape, velocity, decode. Both halves run through one module, :class:`TransfusionModel`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from unirl.config.precision import parse_dtype
from unirl.config.require import ConfigError
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.guidance import NoGuidance
from unirl.models.common.progress import hf_progress_bars_disabled
from unirl.models.common_ar.bundle import dtype_keyword
from unirl.models.qwen3.bundle import Qwen3Bundle
from unirl.models.unified.conditions import ContextConditions
from unirl.models.unified.config import PRESET_NAMES, TransfusionBundleConfig
from unirl.models.unified.model import ImageHead, TransfusionModel
from unirl.sde.schedule import sigmas_from_scheduler_config
from unirl.types import Conditions, DiffusionSamplingParams

if TYPE_CHECKING:
    pass

# the σ policy of the tiny family: a flow-match Euler schedule with SD3's static shift
SCHEDULER_CONFIG: ConfigDict = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}


def tiny_vae_folder() -> Path:
    """The tiny SD3 preset's VAE folder (the shaped, strongly responsive tiny decoder of
    ``unirl.models.common.tiny_vae``; built once per machine)."""
    from unirl.models.sd3 import tiny_preset_path

    return tiny_preset_path() / "vae"


def image_head_for(
    lm_config: Any, config: TransfusionBundleConfig, latent_channels: int
) -> ImageHead:
    return ImageHead(
        latent_channels=latent_channels,
        patch_size=config.patch_size,
        hidden_size=int(lm_config.hidden_size),
        max_grid=config.max_grid,
    )


class TransfusionBundle(Qwen3Bundle):
    """A tiny transfusion model: ``model`` (a :class:`TransfusionModel`: the tiny Qwen3 and
    an image head drawn from ``image_seed``), its tokenizer, and a frozen tiny VAE.

    Guidance is :class:`NoGuidance`: the model is trained without an unconditional branch,
    so ``guidance_scale`` must be 1.
    """

    config_class: ClassVar[type[TransfusionBundleConfig]] = TransfusionBundleConfig  # type: ignore[assignment]
    guidance: ClassVar[NoGuidance] = NoGuidance()
    trainable_attr: ClassVar[str] = "model"
    trainable_module_names: ClassVar[tuple[str, ...]] = ("model",)
    scheduler_config: ClassVar[ConfigDict] = SCHEDULER_CONFIG

    config: TransfusionBundleConfig

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.vae.to(self.device).requires_grad_(False).eval()

    def _load(self) -> tuple[nn.Module, Any]:
        from diffusers import AutoencoderKL

        lm, tokenizer = super()._load()
        self.vae_dtype = parse_dtype(self.config.vae_dtype, "bundle.vae_dtype")
        with hf_progress_bars_disabled():
            self.vae = AutoencoderKL.from_pretrained(
                str(tiny_vae_folder()), **{dtype_keyword(): self.vae_dtype}
            )
        self.latent_channels = int(self.vae.config.latent_channels)
        self.vae_scale = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.scaling_factor = float(self.vae.config.scaling_factor)
        self.shift_factor = float(self.vae.config.shift_factor or 0.0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.image_seed)
            head = image_head_for(lm.config, self.config, self.latent_channels)
        head.to(device=self.device, dtype=self.dtype)
        return TransfusionModel(lm, head), tokenizer

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Before Ray: the path is a preset of this family; image sizes fit the patch grid."""
        path = str(block.get("path", "tiny"))
        if path not in PRESET_NAMES:
            raise ConfigError(
                f"bundle.path={path!r}: the transfusion family has only the 'tiny' preset; the "
                "real HunyuanImage-3.0 is served by vLLM-Omni (recipe unified_model/hi3_vllmomni)"
            )

    @classmethod
    def check_image_sizes(
        cls, block: Mapping[str, object], height: int, width: int, where: str
    ) -> None:
        """Before Ray, from configs only (the tiny VAE's ``config.json``, the bundle block):
        ``height`` / ``width`` are multiples of VAE factor x ``patch_size`` and their patch grid
        fits ``max_grid``; each refused in one line naming ``<where>.height`` / ``.width``."""
        # the recipe's values, typed by the config class that takes them
        knobs: dict[str, Any] = {k: v for k, v in block.items() if not str(k).startswith("_")}
        config = cls.config_class(**knobs)
        vae = json.loads((tiny_vae_folder() / "config.json").read_text())
        scale = 2 ** (len(vae["block_out_channels"]) - 1)
        side = scale * config.patch_size
        for key, size in (("height", height), ("width", width)):
            if size % side:
                lower, upper = max(side, size - size % side), size - size % side + side
                raise ConfigError(
                    f"{where}.{key}={size} is not a multiple of {side} (VAE factor {scale} x "
                    f"bundle.patch_size={config.patch_size}); use {lower} or {upper}"
                )
        grid = max(height, width) // side
        if grid > config.max_grid:
            raise ConfigError(
                f"{where}.height x width = {height}x{width} make a {grid}-patch side, over "
                f"bundle.max_grid={config.max_grid}; lower the size to at most "
                f"{config.max_grid * side} or raise bundle.max_grid"
            )

    @classmethod
    def trainable_on_meta(cls, block: Mapping[str, object]) -> nn.Module | None:
        """The whole :class:`TransfusionModel` on the meta device (LoRA-target checks)."""
        lm = super().trainable_on_meta({**block, "path": "tiny"})
        if lm is None:
            return None
        # the recipe's values, typed by the config class that takes them
        knobs: dict[str, Any] = {k: v for k, v in block.items() if not str(k).startswith("_")}
        config = cls.config_class(**knobs)
        with torch.device("meta"):
            return TransfusionModel(lm, image_head_for(lm.config, config, 16))

    # -- the image half: what the shared flow-matching loop asks of a family ----------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        side = self.vae_scale * self.config.patch_size
        for key, size in (("height", height), ("width", width)):
            if size % side:
                raise ValueError(
                    f"sampling.{key}={size} is not a multiple of {side} (VAE x{self.vae_scale}, "
                    f"patch {self.config.patch_size})"
                )
        grid = max(height, width) // side
        if grid > self.config.max_grid:
            raise ValueError(
                f"sampling height/width {height}x{width} make a {grid}-patch side, over "
                f"bundle.max_grid={self.config.max_grid}"
            )
        return (self.latent_channels, height // self.vae_scale, width // self.vae_scale)

    def latent_shape_for(self, params: DiffusionSamplingParams) -> tuple[int, ...]:
        return self.latent_shape(int(params.height), int(params.width))

    def image_seq_len(self, height: int, width: int) -> int:
        side = self.vae_scale * self.config.patch_size
        return (height // side) * (width // side)

    def sigmas(self, num_inference_steps: int, height: int, width: int) -> torch.Tensor:
        return sigmas_from_scheduler_config(
            self.scheduler_config,
            num_inference_steps,
            image_seq_len=self.image_seq_len(height, width),
        )

    def prompt_context(self, prompts: list[str]) -> ContextConditions:
        """The context of an image drawn straight from its prompt (no text written first):
        the formatted prompt's tokens."""
        return ContextConditions.from_rows(self.encode_prompts(prompts))

    def cfg_conditions(self, conditions: Conditions) -> Conditions:
        raise ValueError(
            "the transfusion family has no unconditional branch; set sampling.guidance_scale=1"
        )

    def predict_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, conditions: ContextConditions
    ) -> torch.Tensor:
        """fp32 ``v`` with the shape of ``latents[B, C, h, w]`` at ``sigma[B]``, through the
        model's own forward (peft / FSDP wrappers apply)."""
        ids, mask = conditions.padded(self.device)
        with self.autocast():
            v = self.model(
                image_latents=latents.to(self.dtype),
                sigma=sigma.to(self.device).float(),
                context_ids=ids,
                context_mask=mask,
            )
        return v.float()

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """``pixels[B, 3, H, W]`` float32 in [0, 1] (``decode_chunk_size`` latents per call).
        (``decode`` stays the text half's: token ids to text.)"""
        chunk = self.config.decode_chunk_size
        return torch.cat(
            [self._decode_chunk(latents[i : i + chunk]) for i in range(0, latents.shape[0], chunk)]
        )

    def _decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.to(self.device, torch.float32) / self.scaling_factor + self.shift_factor
        image = self.vae.decode(z.to(self.vae_dtype), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    @property
    def trainable_modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    # -- export (``FSDPBackend.export_pretrained``) ----------------------------------------------

    def save_pretrained(
        self,
        path: str | Path,
        state: dict[str, torch.Tensor],
        write_pretrained: Any,
    ) -> Path:
        """The trained model as three folders of one export: ``text/`` — the causal LM (the
        shared transformer with its LM head) and tokenizer, a ``save_pretrained`` folder plain
        transformers loads and generates from; ``vae/`` — the frozen VAE, a diffusers
        ``AutoencoderKL`` folder; ``image_head.safetensors`` + ``image_head.json`` — the image
        head's weights and shape (drawing needs this family's ``TransfusionModel``, which
        neither library has). ``state``: the whole module's state (``lm.*``, ``image.*``);
        ``write_pretrained(path, model, state, tokenizer)``: the backend's transformers writer."""
        from safetensors.torch import save_file

        path = Path(path)
        lm = {k[len("lm.") :]: v for k, v in state.items() if k.startswith("lm.")}
        head = {
            k[len("image.") :]: v.contiguous() for k, v in state.items() if k.startswith("image.")
        }
        write_pretrained(path / "text", self.model.lm, lm, self.tokenizer)
        self.vae.save_pretrained(str(path / "vae"))
        save_file(head, str(path / "image_head.safetensors"), metadata={"format": "pt"})
        shape = {
            "latent_channels": self.latent_channels,
            "patch_size": self.config.patch_size,
            "hidden_size": int(self.model.lm.config.hidden_size),
            "max_grid": self.config.max_grid,
            "scheduler": SCHEDULER_CONFIG,
        }
        (path / "image_head.json").write_text(json.dumps(shape, indent=2) + "\n")
        return path
