"""Named SD3 sources that need no download, and the one resolver every loader goes through.

- ``tiny``: a random-init toy stack (~1 M parameters) saved once into a cache folder in the
  diffusers layout; ``StableDiffusion3Pipeline.from_pretrained(folder)`` loads it.
- ``sd3.5-medium-arch``: random weights at the real SD3.5-Medium shapes, built in memory.

``resolve_model_source`` maps a recipe's ``path`` to a local folder or an arch spec; a hub
id is looked up in the local Hugging Face cache first and fails fast offline.
"""

from __future__ import annotations

from pathlib import Path

from unirl.models.common.presets import (
    MANIFEST,
    TINY,
    ModelSourceError,
    ModelSources,
    cache_root,
    tiny_preset_folder,
)
from unirl.models.common.tiny import save_pipeline
from unirl.models.sd3.arch import ARCH_SPECS, SD3ArchSpec
from unirl.models.sd3.tiny import (
    TINY_BUILDER_VERSION,
    TinySD3Spec,
    build_tiny_pipeline,
    corpus_lines,
)

SD35_MEDIUM_ARCH = "sd3.5-medium-arch"
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_SPECS)

# The diffusers sub-folders SD3 needs; a hub snapshot is restricted to them so the
# single-file checkpoints some repos also ship are not fetched.
SD3_COMPONENTS = (
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "tokenizer",
    "tokenizer_2",
    "tokenizer_3",
    "scheduler",
)
SOURCES = ModelSources(family="SD3", arch_presets=tuple(ARCH_SPECS), components=SD3_COMPONENTS)

__all__ = [
    "MANIFEST",
    "PRESET_NAMES",
    "SD35_MEDIUM_ARCH",
    "TINY",
    "ModelSourceError",
    "arch_spec",
    "architecture_configs",
    "cache_root",
    "resolve_model_source",
    "tiny_preset_path",
]


def tiny_preset_path(
    spec: TinySD3Spec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The folder of the ``tiny`` preset, built on first use, at ``<cache>/presets/tiny-<key>``
    (``unirl.models.common.presets.tiny_preset_folder``)."""
    spec = spec or TinySD3Spec()
    return tiny_preset_folder(
        spec,
        preset=TINY,
        folder_prefix="tiny",
        builder=TINY_BUILDER_VERSION,
        corpus=corpus_lines(),
        write=lambda folder: save_pipeline(build_tiny_pipeline(spec), folder),
        cache_dir=cache_dir,
    )


def arch_spec(name: str) -> SD3ArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    return SOURCES.arch_spec(ARCH_SPECS, name)


def architecture_configs(path_or_preset: str) -> tuple[dict, dict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""

    def tiny() -> tuple[dict, dict]:
        from unirl.models.sd3.tiny import transformer_config, vae_config

        spec = TinySD3Spec()
        return transformer_config(spec), vae_config(spec)

    return SOURCES.architecture_configs(path_or_preset, tiny=tiny, arch=arch_spec)


def resolve_model_source(path_or_preset: str) -> Path | SD3ArchSpec:
    """``tiny`` -> cached local folder; ``sd3.5-medium-arch`` -> :class:`SD3ArchSpec`;
    an existing folder -> itself; ``org/name`` -> a hub snapshot (local cache first).

    A hub id that is not cached fails fast with :class:`ModelSourceError` when
    ``HF_HUB_OFFLINE=1`` or the hub is unreachable; the message names the presets and
    ``PRETRAINED_MODEL``.
    """
    return SOURCES.resolve(path_or_preset, tiny=tiny_preset_path, arch=arch_spec)
