"""Named HunyuanVideo 1.5 sources that need no download, and the resolver every loader goes
through.

- ``tiny``: a random toy stack saved once into the shared preset cache in the diffusers layout;
  ``diffusers.HunyuanVideo15Pipeline.from_pretrained(folder)`` loads it.
- ``hunyuan-video-1.5-arch``: random weights at the released 480p text-to-video shapes, built
  in memory.

A local ``save_pretrained`` folder is used as it is; a hub id
(``hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v``) is looked up in the local
Hugging Face cache first and fails fast offline, naming the presets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unirl.config.precision import parse_dtype
from unirl.config.require import require
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import TINY, ModelSources, tiny_preset_folder
from unirl.models.common.tiny import corpus_lines
from unirl.models.hunyuan_video.arch import ARCH_SPECS, HunyuanVideo15ArchSpec
from unirl.models.hunyuan_video.config import HunyuanVideo15BundleConfig
from unirl.models.hunyuan_video.tiny import (
    TINY_BUILDER_VERSION,
    TinyHunyuanVideo15Spec,
    transformer_config,
    vae_config,
    write_tiny_hunyuan_video,
)

HUNYUAN_VIDEO15_ARCH = "hunyuan-video-1.5-arch"
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_SPECS)
COMPONENTS = (
    "transformer",
    "vae",
    "text_encoder",
    "tokenizer",
    "text_encoder_2",
    "tokenizer_2",
    "scheduler",
    "guider",
)
SOURCES = ModelSources(
    family="HunyuanVideo 1.5", arch_presets=tuple(ARCH_SPECS), components=COMPONENTS
)


def tiny_preset_path(
    spec: TinyHunyuanVideo15Spec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The ``tiny`` preset's folder, built on first use, at
    ``<cache>/presets/hunyuan-video15-tiny-<key>`` (``common.presets.tiny_preset_folder``)."""
    spec = spec or TinyHunyuanVideo15Spec()
    return tiny_preset_folder(
        spec,
        preset="hunyuan-video15-tiny",
        folder_prefix="hunyuan-video15-tiny",
        builder=TINY_BUILDER_VERSION,
        corpus=corpus_lines(),
        write=lambda folder: write_tiny_hunyuan_video(folder, spec),
        cache_dir=cache_dir,
        key_extra={"family": "hunyuan_video15"},
    )


def arch_spec(name: str) -> HunyuanVideo15ArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    if name not in ARCH_SPECS:
        raise KeyError(
            f"unknown HunyuanVideo 1.5 arch preset {name!r}; known: {sorted(ARCH_SPECS)}"
        )
    return ARCH_SPECS[name]()


def architecture_configs(path_or_preset: str) -> tuple[ConfigDict, ConfigDict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""

    def tiny() -> tuple[ConfigDict, ConfigDict]:
        spec = TinyHunyuanVideo15Spec()
        return transformer_config(spec), vae_config(spec)

    return SOURCES.architecture_configs(path_or_preset, tiny=tiny, arch=arch_spec)


def resolve_model_source(path_or_preset: str) -> Path | HunyuanVideo15ArchSpec:
    """``tiny`` -> its cached local folder; an ``*-arch`` preset -> its spec; an existing folder
    -> itself; ``org/name`` -> a hub snapshot (local cache first, fails fast offline with
    :class:`~unirl.models.common.presets.ModelSourceError`)."""
    kind, name = SOURCES.classify(path_or_preset)
    if kind == "tiny":
        return tiny_preset_path()
    if kind == "arch":
        return arch_spec(name)
    if kind == "folder":
        return Path(name)
    return SOURCES.snapshot(name)


def scheduler_config_of(raw: ConfigDict) -> ConfigDict:
    """The σ policy of a checkpoint's scheduler config: its ``FlowMatchEulerDiscreteScheduler``
    keys, plus ``sigma_spacing: linspace`` (the pipeline hands the scheduler ``linspace(1, 0,
    T + 1)[:-1]``, which in float32 is ``linspace(1, 1/T, T)``)."""
    require(
        raw.get("_class_name", "FlowMatchEulerDiscreteScheduler")
        == "FlowMatchEulerDiscreteScheduler",
        f"the checkpoint's scheduler is {raw.get('_class_name')}; UniRL reads HunyuanVideo 1.5's "
        "FlowMatchEulerDiscreteScheduler only",
    )
    config = {k: v for k, v in raw.items() if not k.startswith("_")}
    config["sigma_spacing"] = "linspace"
    return config


def load_folder(folder: Path, cfg: HunyuanVideo15BundleConfig) -> dict[str, Any]:
    """Components of a diffusers HunyuanVideo 1.5 folder (``save_pretrained`` layout), on CPU,
    cast."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel
    from transformers import AutoTokenizer, Qwen2_5_VLTextModel, T5EncoderModel

    index = json.loads((folder / "model_index.json").read_text())
    pipeline_class = index.get("_class_name")
    require(
        pipeline_class == "HunyuanVideo15Pipeline",
        f"bundle.path={cfg.path!r} is a {pipeline_class} checkpoint; UniRL's HunyuanVideo 1.5 "
        "family reads the text-to-video pipeline (HunyuanVideo15Pipeline) only",
    )
    common = {"local_files_only": True}
    text_dtype = parse_dtype(cfg.text_encoder_dtype, "bundle.text_encoder_dtype")
    return {
        "transformer": HunyuanVideo15Transformer3DModel.from_pretrained(
            folder,
            subfolder="transformer",
            torch_dtype=parse_dtype(cfg.dtype, "bundle.dtype"),
            **common,
        ),
        "vae": AutoencoderKLHunyuanVideo15.from_pretrained(
            folder,
            subfolder="vae",
            torch_dtype=parse_dtype(cfg.vae_dtype, "bundle.vae_dtype"),
            **common,
        ),
        "text_encoder": Qwen2_5_VLTextModel.from_pretrained(
            folder, subfolder="text_encoder", dtype=text_dtype, **common
        ),
        "text_encoder_2": T5EncoderModel.from_pretrained(
            folder, subfolder="text_encoder_2", dtype=text_dtype, **common
        ),
        "tokenizer": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer", **common),
        "tokenizer_2": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer_2", **common),
        "scheduler_config": json.loads(
            (folder / "scheduler" / "scheduler_config.json").read_text()
        ),
    }
