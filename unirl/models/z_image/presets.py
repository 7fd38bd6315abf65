"""Named Z-Image sources that need no download, and the resolver every loader goes through.

- ``tiny``: a random-init toy stack (~1 M parameters) saved once into the shared preset
  cache in the diffusers layout; ``diffusers.ZImagePipeline.from_pretrained(folder)`` loads it.
- ``z-image-arch``: random weights at the released Z-Image shapes, built in memory.

A local ``save_pretrained`` folder is used as it is; ``Tongyi-MAI/Z-Image`` (or any hub id)
is looked up in the local Hugging Face cache first and fails fast offline, naming the presets.
"""

from __future__ import annotations

from pathlib import Path

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import TINY, ModelSources, family_tiny_preset_folder
from unirl.models.common.tiny import save_pipeline
from unirl.models.z_image.arch import ARCH_SPECS, ZImageArchSpec
from unirl.models.z_image.tiny import (
    TINY_BUILDER_VERSION,
    TinyZImageSpec,
    build_tiny_pipeline,
    transformer_config,
    vae_config,
)

Z_IMAGE_ARCH = "z-image-arch"
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_SPECS)
Z_IMAGE_COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
SOURCES = ModelSources(
    family="Z-Image", arch_presets=tuple(ARCH_SPECS), components=Z_IMAGE_COMPONENTS
)


def tiny_preset_path(
    spec: TinyZImageSpec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The folder of the ``tiny`` preset, built on first use, at
    ``<cache>/presets/z-image-tiny-<key>``
    (``unirl.models.common.presets.family_tiny_preset_folder``)."""
    spec = spec or TinyZImageSpec()
    return family_tiny_preset_folder(
        "z-image",
        spec,
        builder=TINY_BUILDER_VERSION,
        write=lambda folder: save_pipeline(build_tiny_pipeline(spec), folder),
        cache_dir=cache_dir,
    )


def arch_spec(name: str) -> ZImageArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    return SOURCES.arch_spec(ARCH_SPECS, name)


def architecture_configs(path_or_preset: str) -> tuple[ConfigDict, ConfigDict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""

    def tiny() -> tuple[ConfigDict, ConfigDict]:
        spec = TinyZImageSpec()
        return transformer_config(spec), vae_config(spec)

    return SOURCES.architecture_configs(path_or_preset, tiny=tiny, arch=arch_spec)


def resolve_model_source(path_or_preset: str) -> Path | ZImageArchSpec:
    """``tiny`` -> cached local folder; ``z-image-arch`` -> :class:`ZImageArchSpec`; an
    existing folder -> itself; ``org/name`` -> a hub snapshot (local cache first, fails fast
    offline with :class:`~unirl.models.common.presets.ModelSourceError`)."""
    return SOURCES.resolve(path_or_preset, tiny=tiny_preset_path, arch=arch_spec)
