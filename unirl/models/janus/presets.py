"""Named Janus sources that need no download, and the resolver the bundle goes through.

- ``tiny``: a random-init toy ``JanusForConditionalGeneration`` with a locally trained
  tokenizer, saved once into ``<cache>/presets/janus-tiny-<key>``.
- ``janus-pro-{1b,7b}-arch``: random weights at the released shapes, built in memory.
"""

from __future__ import annotations

from pathlib import Path

from unirl.models.common.presets import TINY, tiny_preset_folder
from unirl.models.common_ar.sources import CausalLMSources
from unirl.models.common_ar.tiny import tokenizer_lines
from unirl.models.janus.arch import ARCH_CONFIGS
from unirl.models.janus.tiny import TINY_BUILDER_VERSION, TinyJanusSpec, write_tiny_janus

PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_CONFIGS)
SOURCES = CausalLMSources(family="Janus-Pro", arch_presets=tuple(ARCH_CONFIGS))


def tiny_preset_path(
    spec: TinyJanusSpec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The ``tiny`` preset's folder, built on first use (once per machine, under a lock)."""
    spec = spec or TinyJanusSpec()
    return tiny_preset_folder(
        spec,
        preset=TINY,
        folder_prefix="janus-tiny",
        builder=TINY_BUILDER_VERSION,
        corpus=tokenizer_lines(),
        write=lambda folder: write_tiny_janus(folder, spec),
        cache_dir=cache_dir,
        marker="config.json",
    )
