"""Where a causal LM's weights come from: a preset, a local ``save_pretrained`` folder or a hub
id, classified without loading anything (what ``dry_run`` checks) and resolved from the local
Hugging Face cache first, failing fast offline with a message that names the presets.

The same four kinds as the diffusion families (``unirl.models.common.presets``), for the
transformers layout: a folder counts when it holds ``config.json``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.presets import TINY, ModelSourceError, hf_offline

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what a causal-LM snapshot needs: configs, weights, tokenizer files, chat template
SNAPSHOT_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.txt",
    "*.model",
    "*.jinja",
    "tokenizer*",
)


@dataclass(frozen=True, kw_only=True)
class CausalLMSources:
    """How one family names its sources: its label and its ``*-arch`` presets."""

    family: str
    arch_presets: tuple[str, ...]

    @property
    def preset_names(self) -> tuple[str, ...]:
        return (TINY, *self.arch_presets)

    def not_found(self, path: str, why: str) -> ModelSourceError:
        arch = " or ".join(f"path={name}" for name in self.arch_presets)
        return ModelSourceError(
            f"model path {path!r}: {why}. Without network access use a preset: path=tiny (toy "
            f"{self.family} built locally, for tests and the quick-start) or {arch} (random "
            "weights at the real shapes, for benchmarks); or point the PRETRAINED_MODEL "
            "environment variable (the recipes' bundle.path) at a local save_pretrained folder."
        )

    def classify(self, path_or_preset: str) -> tuple[str, str]:
        """``(kind, name)`` with kind ``tiny`` | ``arch`` | ``folder`` | ``hub``; builds,
        loads and downloads nothing. A hub id is taken on trust here (checked when it loads)."""
        name = str(path_or_preset).strip()
        if name == TINY:
            return "tiny", name
        if name in self.arch_presets:
            return "arch", name
        local = Path(name).expanduser()
        if local.is_dir():
            if not (local / "config.json").is_file():
                raise self.not_found(
                    name, f"the folder is not a transformers {self.family} layout (no config.json)"
                )
            return "folder", str(local)
        if not _HUB_ID.match(name) or name.startswith((".", "/", "~")):
            raise self.not_found(
                name, "no such local folder, and it is not a hub id of the form 'org/name'"
            )
        return "hub", name

    def cached_snapshot(self, name: str) -> Path | None:
        """The hub checkpoint ``name`` from the local Hugging Face cache, or None."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(
                snapshot_download(
                    name, allow_patterns=list(SNAPSHOT_PATTERNS), local_files_only=True
                )
            )
        except (LocalEntryNotFoundError, OSError, ValueError):
            return None

    def snapshot(self, name: str) -> Path:
        """The hub checkpoint ``name``: the local cache first, then a download; fails fast
        with :class:`ModelSourceError` when ``HF_HUB_OFFLINE=1`` or the hub is unreachable."""
        cached = self.cached_snapshot(name)
        if cached is not None:
            return cached
        if hf_offline():
            raise self.not_found(
                name,
                "no such local folder, not in the local Hugging Face cache, and HF_HUB_OFFLINE=1",
            )
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(name, allow_patterns=list(SNAPSHOT_PATTERNS)))
        except Exception as exc:  # network, auth (gated repo) or missing repo: all mean "not here"
            raise self.not_found(
                name, f"not cached locally and the download failed ({type(exc).__name__}: {exc})"
            ) from exc

    def folder_config(self, folder: Path) -> ConfigDict | None:
        """``config.json`` of a folder (None when unreadable)."""
        try:
            return json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            return None
