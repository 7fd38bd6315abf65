"""Named Qwen-Image sources that need no download, and the resolver every loader goes through.

- ``tiny``: a random-init toy stack (~0.7 M parameters) saved once into the shared preset
  cache in the diffusers layout; ``diffusers.QwenImagePipeline.from_pretrained(folder)``
  loads it.
- ``qwen-image-arch``: random weights at the released Qwen-Image shapes, built in memory.

A local ``save_pretrained`` folder is used as it is; ``Qwen/Qwen-Image`` (or any hub id) is
looked up in the local Hugging Face cache first and fails fast offline, naming the presets.
"""

from __future__ import annotations

from pathlib import Path

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import TINY, ModelSources, family_tiny_preset_folder
from unirl.models.common.tiny import save_pipeline
from unirl.models.qwen_image.arch import ARCH_SPECS, QwenImageArchSpec
from unirl.models.qwen_image.tiny import (
    TINY_BUILDER_VERSION,
    TinyQwenImageSpec,
    build_tiny_pipeline,
    transformer_config,
    vae_config,
)

QWEN_IMAGE_ARCH = "qwen-image-arch"
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_SPECS)
QWEN_IMAGE_COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
SOURCES = ModelSources(
    family="Qwen-Image", arch_presets=tuple(ARCH_SPECS), components=QWEN_IMAGE_COMPONENTS
)


def tiny_preset_path(
    spec: TinyQwenImageSpec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The folder of the ``tiny`` preset, built on first use, at
    ``<cache>/presets/qwen-image-tiny-<key>``
    (``unirl.models.common.presets.family_tiny_preset_folder``)."""
    spec = spec or TinyQwenImageSpec()
    return family_tiny_preset_folder(
        "qwen-image",
        spec,
        builder=TINY_BUILDER_VERSION,
        write=lambda folder: save_pipeline(build_tiny_pipeline(spec), folder),
        cache_dir=cache_dir,
    )


def arch_spec(name: str) -> QwenImageArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    return SOURCES.arch_spec(ARCH_SPECS, name)


def architecture_configs(path_or_preset: str) -> tuple[ConfigDict, ConfigDict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""

    def tiny() -> tuple[ConfigDict, ConfigDict]:
        spec = TinyQwenImageSpec()
        return transformer_config(spec), vae_config(spec)

    return SOURCES.architecture_configs(path_or_preset, tiny=tiny, arch=arch_spec)


def resolve_model_source(path_or_preset: str) -> Path | QwenImageArchSpec:
    """``tiny`` -> cached local folder; ``qwen-image-arch`` -> :class:`QwenImageArchSpec`;
    an existing folder -> itself; ``org/name`` -> a hub snapshot (local cache first, fails
    fast offline with :class:`~unirl.models.common.presets.ModelSourceError`)."""
    return SOURCES.resolve(path_or_preset, tiny=tiny_preset_path, arch=arch_spec)
