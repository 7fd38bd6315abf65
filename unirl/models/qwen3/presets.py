"""Named Qwen3 sources that need no download, and the resolver the bundle goes through.

- ``tiny``: a random-init toy ``Qwen3ForCausalLM`` with a locally trained tokenizer, saved once
  into ``<cache>/presets/qwen3-tiny-<key>`` (``unirl.models.common.presets.tiny_preset_folder``).
- ``qwen3-{0.6b,1.7b,4b,8b}-arch``: random weights at the released shapes, built in memory.
"""

from __future__ import annotations

from pathlib import Path

from unirl.models.common.presets import TINY, tiny_preset_folder
from unirl.models.common_ar.sources import CausalLMSources
from unirl.models.common_ar.tiny import tokenizer_lines
from unirl.models.qwen3.arch import ARCH_CONFIGS
from unirl.models.qwen3.tiny import TINY_BUILDER_VERSION, TinyQwen3Spec, write_tiny_qwen3

PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_CONFIGS)
SOURCES = CausalLMSources(family="Qwen3", arch_presets=tuple(ARCH_CONFIGS))


def tiny_preset_path(
    spec: TinyQwen3Spec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The ``tiny`` preset's folder, built on first use (once per machine, under a lock)."""
    spec = spec or TinyQwen3Spec()
    return tiny_preset_folder(
        spec,
        preset=TINY,
        folder_prefix="qwen3-tiny",
        builder=TINY_BUILDER_VERSION,
        corpus=tokenizer_lines(),
        write=lambda folder: write_tiny_qwen3(folder, spec),
        cache_dir=cache_dir,
        marker="config.json",
    )
