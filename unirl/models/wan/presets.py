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

import json
from pathlib import Path
from typing import Any

from unirl.config.precision import parse_dtype
from unirl.config.require import require
from unirl.models.common.config_dict import ConfigDict, config_float, config_int
from unirl.models.common.presets import TINY, ModelSources, tiny_preset_folder
from unirl.models.common.tiny import corpus_lines
from unirl.models.wan.arch import ARCH_SPECS, WanArchSpec
from unirl.models.wan.config import WanBundleConfig
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


def architecture_configs(path_or_preset: str) -> tuple[ConfigDict, ConfigDict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""
    name = str(path_or_preset).strip()

    def tiny(variant: str = TINY) -> tuple[ConfigDict, ConfigDict]:
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


def scheduler_config_of(raw: ConfigDict) -> ConfigDict:
    """The σ policy of a checkpoint's scheduler config, as a ``FlowMatchEulerDiscreteScheduler``
    config: the released Wan checkpoints ship ``UniPCMultistepScheduler`` with ``flow_shift``;
    UniRL steps with its own kernels and keeps only the shift (see README, Gotchas)."""
    if raw.get("_class_name") == "UniPCMultistepScheduler":
        require(
            bool(raw.get("use_flow_sigmas", True)),
            "the checkpoint's UniPCMultistepScheduler does not use flow sigmas; UniRL reads Wan's "
            "flow-matching schedule only",
        )
        return {
            "num_train_timesteps": config_int(raw, "num_train_timesteps", 1000),
            "shift": config_float(raw, "flow_shift", 1.0),
        }
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def load_folder(folder: Path, cfg: WanBundleConfig) -> dict[str, Any]:
    """Components of a diffusers Wan folder (``save_pretrained`` layout), on CPU, cast."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel

    index = json.loads((folder / "model_index.json").read_text())
    require(
        not index.get("expand_timesteps", False),
        f"bundle.path={cfg.path!r} is a Wan 2.2 TI2V checkpoint (expand_timesteps: per-token "
        "timesteps, 48-channel VAE), which UniRL does not support yet; use a Wan 2.1 or "
        "Wan 2.2 A14B checkpoint",
    )
    common = {"local_files_only": True}
    dtype = parse_dtype(cfg.dtype, "bundle.dtype")
    text_dtype = parse_dtype(cfg.text_encoder_dtype, "bundle.text_encoder_dtype")

    def present(name: str) -> bool:
        entry = index.get(name)
        return isinstance(entry, list) and entry[0] is not None and (folder / name).is_dir()

    parts: dict[str, Any] = {
        "transformer": WanTransformer3DModel.from_pretrained(
            folder, subfolder="transformer", torch_dtype=dtype, **common
        ),
        "transformer_2": WanTransformer3DModel.from_pretrained(
            folder, subfolder="transformer_2", torch_dtype=dtype, **common
        )
        if present("transformer_2")
        else None,
        "vae": AutoencoderKLWan.from_pretrained(
            folder,
            subfolder="vae",
            torch_dtype=parse_dtype(cfg.vae_dtype, "bundle.vae_dtype"),
            **common,
        ),
        "text_encoder": UMT5EncoderModel.from_pretrained(
            folder, subfolder="text_encoder", dtype=text_dtype, **common
        ),
        "tokenizer": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer", **common),
        "scheduler_config": json.loads(
            (folder / "scheduler" / "scheduler_config.json").read_text()
        ),
        "boundary_ratio": index.get("boundary_ratio"),
        "image_encoder": None,
        "image_processor": None,
    }
    if present("image_encoder"):
        from transformers import CLIPImageProcessor, CLIPVisionModel

        parts["image_encoder"] = CLIPVisionModel.from_pretrained(
            folder, subfolder="image_encoder", dtype=text_dtype, **common
        )
        parts["image_processor"] = CLIPImageProcessor.from_pretrained(
            folder, subfolder="image_processor", **common
        )
    return parts


def expert_layout(path: str) -> tuple[bool, float | None] | None:
    """``(two experts?, the checkpoint's boundary_ratio)`` of a source, read without weights;
    None when it is not readable here (an uncached hub id)."""
    name = str(path).strip()
    if name in TINY_VARIANTS:
        spec = tiny_spec(name)
        two = spec.variant == "two_expert"
        return two, spec.boundary_ratio if two else None
    kind, resolved = SOURCES.classify(name)
    if kind == "arch":
        spec_ = arch_spec(resolved)
        return spec_.transformer_2 is not None, spec_.boundary_ratio
    folder = Path(resolved) if kind == "folder" else SOURCES.cached_snapshot(resolved)
    if folder is None or not (folder / "model_index.json").is_file():
        return None
    index = json.loads((folder / "model_index.json").read_text())
    entry = index.get("transformer_2")
    two = isinstance(entry, list) and entry[0] is not None
    return two, index.get("boundary_ratio")
