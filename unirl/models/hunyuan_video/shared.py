"""What both HunyuanVideo generations' bundles share (1.5 here, 1.0 in
``unirl.models.hunyuan_video_v1``): the checks made before anything is built (architecture,
size multiples, ``num_frames``, the trainable module on the meta device) and the loading of
the modules from an ``*-arch`` spec or a diffusers folder. Each generation names its own pieces
in a :class:`HunyuanVideoGeneration` and keeps its own geometry checks and encoders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from unirl.models.common.bundle import FlowMatchingBundle, require_size_multiple
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.geometry import VideoGrid, VideoLatentGeometry
from unirl.models.common.progress import hf_progress_bars_disabled


@dataclass(frozen=True)
class HunyuanVideoGeneration:
    """One generation's pieces: its name in messages, its diffusers transformer class, the
    defaults of its VAE factor and patch size, its arch-spec type and its package's functions
    (the config pair of a path, a path's source, modules built from a spec or loaded from a
    folder, the scheduler config, the ``num_frames`` rule)."""

    label: str
    transformer_class: str
    spatial_factor: int
    patch: int
    arch_spec: type
    architecture_configs: Callable[[str], tuple[dict, dict] | None]
    resolve_model_source: Callable[[str], Any]
    build_arch_modules: Callable[..., dict[str, Any]]
    load_folder: Callable[[Any, Any], dict[str, Any]]
    scheduler_config_of: Callable[[ConfigDict], ConfigDict]
    check_num_frames: Callable[[int, int], None]


class HunyuanVideoFamilyBundle(VideoLatentGeometry, FlowMatchingBundle):
    """The shared part of a HunyuanVideo bundle; a subclass sets ``generation``."""

    generation: ClassVar[HunyuanVideoGeneration]

    # -- checks before anything is built ----------------------------------------------------

    @classmethod
    def architecture(cls, path: str) -> tuple[dict, dict] | None:
        return cls.generation.architecture_configs(path)

    @classmethod
    def video_grid(cls, architecture: tuple[dict, dict]) -> VideoGrid:
        transformer, vae = architecture
        gen = cls.generation
        return VideoGrid(
            spatial=int(vae.get("spatial_compression_ratio", gen.spatial_factor)),
            temporal=int(vae.get("temporal_compression_ratio", 4)),
            patch_t=int(transformer.get("patch_size_t", 1)),
            patch=int(transformer.get("patch_size", gen.patch)),
        )

    @classmethod
    def check_image_size(cls, architecture: tuple[dict, dict], key: str, size: int) -> None:
        grid = cls.video_grid(architecture)
        require_size_multiple(
            key,
            size,
            grid.spatial * grid.patch,
            f"VAE factor {grid.spatial} x {grid.patch}x{grid.patch} patches of "
            f"{cls.generation.label}",
        )

    @classmethod
    def trainable_from_architecture(cls, architecture: tuple[dict, dict]) -> torch.nn.Module:
        import diffusers

        config = {k: v for k, v in architecture[0].items() if not k.startswith("_")}
        model: torch.nn.Module = getattr(diffusers, cls.generation.transformer_class).from_config(
            config
        )
        return model

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """The shared checks (model path, sizes), then ``num_frames`` of the form 4k + 1."""
        super().check_config(block, recipe)
        sampling = getattr(recipe, "sampling", None) or {}
        frames = sampling.get("num_frames") if isinstance(sampling, dict) else None
        if isinstance(frames, int) and not isinstance(frames, bool):
            architecture = cls.architecture(cls._path_of(block))
            ratio = (
                4
                if architecture is None
                else int(architecture[1].get("temporal_compression_ratio", 4))
            )
            cls.generation.check_num_frames(frames, ratio)

    # -- modules -------------------------------------------------------------------------------

    def load_modules(self) -> None:
        """The transformer, VAE, both text encoders and tokenizers and the scheduler config
        (``flow_shift`` applied), from the ``*-arch`` spec or the folder ``path`` names."""
        cfg: Any = self.config
        gen = self.generation
        self.source = gen.resolve_model_source(cfg.path)
        if isinstance(self.source, gen.arch_spec):
            parts = gen.build_arch_modules(
                self.source,
                device=self.device,
                dtype=self.dtype,
                text_encoder_dtype=self.text_encoder_dtype,
                vae_dtype=self.vae_dtype,
            )
        else:
            with hf_progress_bars_disabled():
                parts = gen.load_folder(self.source, cfg)
        self.transformer: torch.nn.Module = parts["transformer"]
        self.vae: Any = parts["vae"]
        self.text_encoder: torch.nn.Module = parts["text_encoder"]
        self.text_encoder_2: torch.nn.Module = parts["text_encoder_2"]
        self.tokenizer = parts["tokenizer"]
        self.tokenizer_2 = parts["tokenizer_2"]
        scheduler = gen.scheduler_config_of(dict(parts["scheduler_config"]))
        if cfg.flow_shift is not None:
            scheduler["shift"] = float(cfg.flow_shift)
        self.scheduler_config: ConfigDict = scheduler
