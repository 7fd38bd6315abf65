"""Named HunyuanVideo 1.0 sources that need no download, and the resolver every loader goes
through.

- ``tiny``: a random toy stack saved once into the shared preset cache in the diffusers layout;
  ``diffusers.HunyuanVideoPipeline.from_pretrained(folder)`` loads it.
- ``hunyuan-video-arch``: random weights at the released shapes, built in memory.

A local ``save_pretrained`` folder is used as it is; a hub id
(``hunyuanvideo-community/HunyuanVideo``) is looked up in the local Hugging Face cache first
and fails fast offline, naming the presets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unirl.config.precision import parse_dtype
from unirl.config.require import require
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import ModelSources, family_tiny_preset_folder
from unirl.models.hunyuan_video_v1.arch import ARCH_SPECS, HunyuanVideoArchSpec
from unirl.models.hunyuan_video_v1.config import HunyuanVideoBundleConfig
from unirl.models.hunyuan_video_v1.tiny import (
    TINY_BUILDER_VERSION,
    TinyHunyuanVideoSpec,
    transformer_config,
    vae_config,
    write_tiny_hunyuan_video,
)

HUNYUAN_VIDEO_ARCH = "hunyuan-video-arch"
PRESET_NAMES: tuple[str, ...] = ("tiny", *ARCH_SPECS)
COMPONENTS = (
    "transformer",
    "vae",
    "text_encoder",
    "tokenizer",
    "text_encoder_2",
    "tokenizer_2",
    "scheduler",
)
SOURCES = ModelSources(
    family="HunyuanVideo 1.0", arch_presets=tuple(ARCH_SPECS), components=COMPONENTS
)


def tiny_preset_path(
    spec: TinyHunyuanVideoSpec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The ``tiny`` preset's folder, built on first use, at
    ``<cache>/presets/hunyuan-video-tiny-<key>`` (``common.presets.family_tiny_preset_folder``)."""
    spec = spec or TinyHunyuanVideoSpec()
    return family_tiny_preset_folder(
        "hunyuan-video",
        spec,
        builder=TINY_BUILDER_VERSION,
        write=lambda folder: write_tiny_hunyuan_video(folder, spec),
        cache_dir=cache_dir,
    )


def arch_spec(name: str) -> HunyuanVideoArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    return SOURCES.arch_spec(ARCH_SPECS, name)


def architecture_configs(path_or_preset: str) -> tuple[ConfigDict, ConfigDict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""

    def tiny() -> tuple[ConfigDict, ConfigDict]:
        spec = TinyHunyuanVideoSpec()
        return transformer_config(spec), vae_config(spec)

    return SOURCES.architecture_configs(path_or_preset, tiny=tiny, arch=arch_spec)


def resolve_model_source(path_or_preset: str) -> Path | HunyuanVideoArchSpec:
    """``tiny`` -> its cached local folder; an ``*-arch`` preset -> its spec; an existing folder
    -> itself; ``org/name`` -> a hub snapshot (local cache first, fails fast offline with
    :class:`~unirl.models.common.presets.ModelSourceError`)."""
    resolved: Path | HunyuanVideoArchSpec = SOURCES.resolve(
        path_or_preset, tiny=tiny_preset_path, arch=arch_spec
    )
    return resolved


def scheduler_config_of(raw: ConfigDict) -> ConfigDict:
    """The σ policy of a checkpoint's scheduler config: its ``FlowMatchEulerDiscreteScheduler``
    keys, plus ``sigma_spacing: linspace`` (the pipeline hands the scheduler ``linspace(1, 0,
    T + 1)[:-1]``, which in float32 is ``linspace(1, 1/T, T)``)."""
    require(
        raw.get("_class_name", "FlowMatchEulerDiscreteScheduler")
        == "FlowMatchEulerDiscreteScheduler",
        f"the checkpoint's scheduler is {raw.get('_class_name')}; UniRL reads HunyuanVideo's "
        "FlowMatchEulerDiscreteScheduler only",
    )
    config = {k: v for k, v in raw.items() if not k.startswith("_")}
    config["sigma_spacing"] = "linspace"
    return config


def load_folder(folder: Path, cfg: HunyuanVideoBundleConfig) -> dict[str, Any]:
    """Components of a diffusers HunyuanVideo 1.0 folder (``save_pretrained`` layout), on CPU,
    cast."""
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoTransformer3DModel
    from transformers import AutoTokenizer, CLIPTextModel, LlamaModel

    index = json.loads((folder / "model_index.json").read_text())
    pipeline_class = index.get("_class_name")
    require(
        pipeline_class == "HunyuanVideoPipeline",
        f"bundle.path={cfg.path!r} is a {pipeline_class} checkpoint; UniRL's HunyuanVideo 1.0 "
        "family reads the text-to-video pipeline (HunyuanVideoPipeline) only "
        "(HunyuanVideo15Pipeline: unirl.models.hunyuan_video.HunyuanVideo15Bundle)",
    )
    common = {"local_files_only": True}
    text_dtype = parse_dtype(cfg.text_encoder_dtype, "bundle.text_encoder_dtype")
    return {
        "transformer": HunyuanVideoTransformer3DModel.from_pretrained(
            folder,
            subfolder="transformer",
            torch_dtype=parse_dtype(cfg.dtype, "bundle.dtype"),
            **common,
        ),
        "vae": AutoencoderKLHunyuanVideo.from_pretrained(
            folder,
            subfolder="vae",
            torch_dtype=parse_dtype(cfg.vae_dtype, "bundle.vae_dtype"),
            **common,
        ),
        "text_encoder": LlamaModel.from_pretrained(
            folder, subfolder="text_encoder", dtype=text_dtype, **common
        ),
        "text_encoder_2": CLIPTextModel.from_pretrained(
            folder, subfolder="text_encoder_2", dtype=text_dtype, **common
        ),
        "tokenizer": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer", **common),
        "tokenizer_2": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer_2", **common),
        "scheduler_config": json.loads(
            (folder / "scheduler" / "scheduler_config.json").read_text()
        ),
    }
