"""Named Wan sources that need no download, and the resolver every loader goes through.

- ``tiny`` (Wan 2.1 T2V), ``tiny-wan2.2`` (two experts) and ``tiny-i2v`` (Wan 2.1 I2V): random
  toy stacks saved once into the shared preset cache in the diffusers layout;
  ``diffusers.WanPipeline.from_pretrained(folder)`` (``WanImageToVideoPipeline`` for
  ``tiny-i2v``) loads them.
- ``wan2.1-1.3b-arch``, ``wan2.2-14b-arch``: random weights at the released shapes, built in
  memory.

A local ``save_pretrained`` folder is used as it is; a hub id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``)
is looked up in the local Hugging Face cache first and fails fast offline, naming the presets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.models.common.presets import TINY, ModelSources, tiny_preset_folder
from unirl.models.common.tiny import corpus_lines
from unirl.models.wan.arch import ARCH_SPECS, WanArchSpec
from unirl.models.wan.tiny import (
    TINY_BUILDER_VERSION,
    TinyWanSpec,
    transformer_config,
    vae_config,
    write_tiny_wan,
)

WAN21_ARCH, WAN22_ARCH = "wan2.1-1.3b-arch", "wan2.2-14b-arch"
# tiny preset name -> variant of TinyWanSpec
TINY_VARIANTS = {TINY: "t2v", "tiny-wan2.2": "two_expert", "tiny-i2v": "i2v"}
PRESET_NAMES: tuple[str, ...] = (*TINY_VARIANTS, *ARCH_SPECS)
WAN_COMPONENTS = (
    "transformer",
    "transformer_2",
    "vae",
    "text_encoder",
    "tokenizer",
    "scheduler",
    "image_encoder",
    "image_processor",
)
SOURCES = ModelSources(family="Wan", arch_presets=tuple(ARCH_SPECS), components=WAN_COMPONENTS)


def tiny_spec(name: str = TINY) -> TinyWanSpec:
    """The spec of a tiny preset (``tiny``, ``tiny-wan2.2``, ``tiny-i2v``)."""
    if name not in TINY_VARIANTS:
        raise KeyError(f"unknown Wan tiny preset {name!r}; known: {sorted(TINY_VARIANTS)}")
    return TinyWanSpec(variant=TINY_VARIANTS[name])


def tiny_preset_path(
    name_or_spec: str | TinyWanSpec = TINY, *, cache_dir: str | Path | None = None
) -> Path:
    """The folder of a tiny preset, built on first use, at
    ``<cache>/presets/wan-tiny-<variant>-<key>`` (``common.presets.tiny_preset_folder``)."""
    spec = tiny_spec(name_or_spec) if isinstance(name_or_spec, str) else name_or_spec
    return tiny_preset_folder(
        spec,
        preset=f"wan-tiny-{spec.variant}",
        folder_prefix=f"wan-tiny-{spec.variant}",
        builder=TINY_BUILDER_VERSION,
        corpus=corpus_lines(),
        write=lambda folder: write_tiny_wan(folder, spec),
        cache_dir=cache_dir,
        key_extra={"family": "wan"},
    )


def arch_spec(name: str) -> WanArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    if name not in ARCH_SPECS:
        raise KeyError(f"unknown Wan arch preset {name!r}; known: {sorted(ARCH_SPECS)}")
    return ARCH_SPECS[name]()


def architecture_configs(path_or_preset: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""
    name = str(path_or_preset).strip()

    def tiny(variant: str = TINY) -> tuple[dict[str, Any], dict[str, Any]]:
        spec = tiny_spec(variant)
        return transformer_config(spec), vae_config(spec)

    if name in TINY_VARIANTS:
        return tiny(name)
    return SOURCES.architecture_configs(name, tiny=tiny, arch=arch_spec)


def resolve_model_source(path_or_preset: str) -> Path | WanArchSpec:
    """A tiny preset -> its cached local folder; an ``*-arch`` preset -> :class:`WanArchSpec`;
    an existing folder -> itself; ``org/name`` -> a hub snapshot (local cache first, fails
    fast offline with :class:`~unirl.models.common.presets.ModelSourceError`)."""
    name = str(path_or_preset).strip()
    if name in TINY_VARIANTS:
        return tiny_preset_path(name)
    kind, resolved = SOURCES.classify(name)
    if kind == "arch":
        return arch_spec(resolved)
    if kind == "folder":
        return Path(resolved)
    return SOURCES.snapshot(resolved)
