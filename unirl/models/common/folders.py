"""Where a bundle's modules come from, written once: an ``*-arch`` spec built on the device,
or a diffusers folder (``save_pretrained`` layout: the tiny preset's cache folder, a local
checkpoint or a hub snapshot) read on CPU in the bundle's dtypes.

A family's ``load`` resolves its ``path`` (``presets.resolve_model_source``) and hands the
source to :func:`load_parts` with its two builders; a folder reader is usually one call of
:func:`read_diffusers_folder` naming the family's classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unirl.models.common.arch import ArchSpec
from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.progress import hf_progress_bars_disabled

if TYPE_CHECKING:
    from unirl.models.common.bundle import FlowMatchingBundle


def read_scheduler_config(folder: Path) -> ConfigDict:
    """``scheduler/scheduler_config.json`` of a diffusers folder."""
    return dict(json.loads((folder / "scheduler" / "scheduler_config.json").read_text()))


def read_diffusers_folder(
    folder: Path,
    bundle: FlowMatchingBundle,
    *,
    transformer: Any,
    vae: Any,
    text_encoders: Mapping[str, Any],
    tokenizers: Sequence[str],
) -> dict[str, Any]:
    """The components of a diffusers folder, on CPU, local files only: ``transformer`` (a
    diffusers model class) in the bundle's ``dtype``, ``vae`` in its ``vae_dtype``, each
    ``text_encoders`` sub-folder (a transformers model class) in its ``text_encoder_dtype``,
    each ``tokenizers`` sub-folder through ``AutoTokenizer``, and ``scheduler_config``."""
    from transformers import AutoTokenizer

    local = {"local_files_only": True}
    return {
        "transformer": transformer.from_pretrained(
            folder, subfolder="transformer", torch_dtype=bundle.dtype, **local
        ),
        "vae": vae.from_pretrained(folder, subfolder="vae", torch_dtype=bundle.vae_dtype, **local),
        **{
            name: cls.from_pretrained(
                folder, subfolder=name, dtype=bundle.text_encoder_dtype, **local
            )
            for name, cls in text_encoders.items()
        },
        **{
            name: AutoTokenizer.from_pretrained(folder, subfolder=name, **local)
            for name in tokenizers
        },
        "scheduler_config": read_scheduler_config(folder),
    }


def load_parts(
    bundle: FlowMatchingBundle,
    source: Path | ArchSpec,
    *,
    build_arch: Callable[..., dict[str, Any]],
    read_folder: Callable[[Path, Any], dict[str, Any]],
) -> dict[str, Any]:
    """The modules of ``source`` (what the family's resolver returned): an ``*-arch`` spec
    built by ``build_arch(spec, device=, dtype=, text_encoder_dtype=, vae_dtype=)`` on the
    bundle's device in its dtypes, else the folder read by ``read_folder(folder, bundle)``
    (progress bars off)."""
    if isinstance(source, ArchSpec):
        return build_arch(
            source,
            device=bundle.device,
            dtype=bundle.dtype,
            text_encoder_dtype=bundle.text_encoder_dtype,
            vae_dtype=bundle.vae_dtype,
        )
    with hf_progress_bars_disabled():
        return read_folder(Path(source), bundle)
