"""Named Qwen2.5-VL sources that need no download: ``tiny`` (built once per machine into
``<cache>/presets/qwen-vl-tiny-<key>``) and ``qwen2.5-vl-{3b,7b}-arch`` (in memory)."""

from __future__ import annotations

from pathlib import Path

from unirl.models.common.presets import TINY, tiny_preset_folder
from unirl.models.common_ar.sources import CausalLMSources
from unirl.models.common_ar.tiny import tokenizer_lines
from unirl.models.qwen_vl.arch import ARCH_CONFIGS
from unirl.models.qwen_vl.tiny import TINY_BUILDER_VERSION, TinyQwenVLSpec, write_tiny_qwen_vl

SOURCES = CausalLMSources(family="Qwen2.5-VL", arch_presets=tuple(ARCH_CONFIGS))
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_CONFIGS)


def tiny_preset_path(
    spec: TinyQwenVLSpec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    spec = spec or TinyQwenVLSpec()
    return tiny_preset_folder(
        spec,
        preset=TINY,
        folder_prefix="qwen-vl-tiny",
        builder=TINY_BUILDER_VERSION,
        corpus=tokenizer_lines(),
        write=lambda folder: write_tiny_qwen_vl(folder, spec),
        cache_dir=cache_dir,
        marker="config.json",
    )
