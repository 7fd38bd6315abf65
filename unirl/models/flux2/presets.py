"""Named FLUX.2-Klein sources that need no download, and the resolver every loader goes through.

- ``tiny``: a random-init toy stack (~1 M parameters, step-distilled) saved once into the
  shared preset cache in the diffusers layout; ``diffusers.Flux2KleinPipeline.from_pretrained``
  loads it. ``tiny_preset_path(TinyFlux2Spec(is_distilled=False))`` builds the undistilled
  (true CFG) variant into its own folder, usable as a local ``path``.
- ``flux2-klein-arch``: random weights at the released FLUX.2-klein-4B shapes, in memory.

A local ``save_pretrained`` folder is used as it is; ``black-forest-labs/FLUX.2-klein-4B`` (or
any hub id) is looked up in the local Hugging Face cache first and fails fast offline, naming
the presets.
"""

from __future__ import annotations

import json
from pathlib import Path

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import TINY, ModelSources, family_tiny_preset_folder
from unirl.models.common.tiny import save_pipeline
from unirl.models.flux2.arch import ARCH_SPECS, Flux2KleinArchSpec
from unirl.models.flux2.tiny import (
    TINY_BUILDER_VERSION,
    TinyFlux2Spec,
    build_tiny_pipeline,
    transformer_config,
    vae_config,
)

FLUX2_KLEIN_ARCH = "flux2-klein-arch"
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_SPECS)
FLUX2_COMPONENTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
SOURCES = ModelSources(
    family="FLUX.2-Klein", arch_presets=tuple(ARCH_SPECS), components=FLUX2_COMPONENTS
)


def tiny_preset_path(
    spec: TinyFlux2Spec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The folder of the ``tiny`` preset (or of another tiny spec), built on first use, at
    ``<cache>/presets/flux2-klein-tiny-<key>``
    (``unirl.models.common.presets.family_tiny_preset_folder``)."""
    spec = spec or TinyFlux2Spec()
    return family_tiny_preset_folder(
        "flux2-klein",
        spec,
        builder=TINY_BUILDER_VERSION,
        write=lambda folder: save_pipeline(build_tiny_pipeline(spec), folder),
        cache_dir=cache_dir,
    )


def arch_spec(name: str) -> Flux2KleinArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    return SOURCES.arch_spec(ARCH_SPECS, name)


def architecture_configs(path_or_preset: str) -> tuple[ConfigDict, ConfigDict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""

    def tiny() -> tuple[ConfigDict, ConfigDict]:
        spec = TinyFlux2Spec()
        return transformer_config(spec), vae_config(spec)

    return SOURCES.architecture_configs(path_or_preset, tiny=tiny, arch=arch_spec)


def folder_is_distilled(folder: Path) -> bool:
    """``is_distilled`` of a diffusers folder's ``model_index.json`` (False when absent, as
    ``Flux2KleinPipeline`` defaults)."""
    index = folder / "model_index.json"
    if not index.is_file():
        return False
    return bool(json.loads(index.read_text()).get("is_distilled", False))


def source_is_distilled(path_or_preset: str) -> bool | None:
    """Whether the model at ``path_or_preset`` is step-distilled (samples without CFG), read
    without building weights; None for a hub checkpoint that is not in the local cache."""
    kind, name = SOURCES.classify(path_or_preset)
    if kind == "tiny":
        return TinyFlux2Spec().is_distilled
    if kind == "arch":
        return arch_spec(name).is_distilled
    folder = Path(name) if kind == "folder" else SOURCES.cached_snapshot(name)
    return None if folder is None else folder_is_distilled(folder)


def resolve_model_source(path_or_preset: str) -> Path | Flux2KleinArchSpec:
    """``tiny`` -> cached local folder; ``flux2-klein-arch`` -> :class:`Flux2KleinArchSpec`;
    an existing folder -> itself; ``org/name`` -> a hub snapshot (local cache first, fails
    fast offline with :class:`~unirl.models.common.presets.ModelSourceError`)."""
    return SOURCES.resolve(path_or_preset, tiny=tiny_preset_path, arch=arch_spec)
