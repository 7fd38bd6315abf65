"""Where a family's weights come from, for every family alike.

A recipe's ``bundle.path`` is one of: ``tiny`` (a toy stack built locally and cached), an
``*-arch`` preset (random weights at the real shapes, built in memory), a local
``save_pretrained`` folder, or a hub id. :class:`ModelSources` classifies a path without
loading anything and resolves a hub id from the local Hugging Face cache first, failing fast
offline with a message that names the presets; :func:`build_cached` builds a preset folder
once per machine, atomically, under a file lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from unirl.models.common.config_dict import ConfigDict, JSONDict, JSONValue
from unirl.models.common.tiny import corpus_lines

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SpecT = TypeVar("SpecT")


class ModelConfigs(Protocol):
    """An ``*-arch`` spec as far as reading its architecture goes: its transformer's and its
    VAE's ``config.json`` dicts."""

    @property
    def transformer(self) -> ConfigDict: ...

    @property
    def vae(self) -> ConfigDict: ...


TINY = "tiny"
MANIFEST = "unirl_preset.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelSourceError(FileNotFoundError):
    """A model path names neither a preset, a local folder, nor a reachable hub checkpoint."""


def cache_root() -> Path:
    """``$UNIRL_CACHE`` if set, else ``~/.cache/unirl``."""
    env = os.environ.get("UNIRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "unirl"


def library_versions() -> list[str]:
    """torch, diffusers, transformers and tokenizers versions (part of every preset key)."""
    import diffusers
    import tokenizers
    import torch
    import transformers

    return [
        torch.__version__,
        diffusers.__version__,
        transformers.__version__,
        tokenizers.__version__,
    ]


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


DIFFUSERS_MARKER = "model_index.json"


def _is_complete(folder: Path, marker: str = DIFFUSERS_MARKER) -> bool:
    """The manifest and the layout's own marker file (``model_index.json`` for a diffusers
    folder, ``config.json`` for a transformers one) are both there."""
    return (folder / MANIFEST).is_file() and (folder / marker).is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (POSIX); elsewhere the atomic rename alone guards."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build_cached(
    root: Path,
    name: str,
    write: Callable[[Path], None],
    manifest: Mapping[str, JSONValue],
    *,
    marker: str = DIFFUSERS_MARKER,
) -> Path:
    """``root/name``, built by ``write(folder)`` on first use.

    The build writes into a temporary sibling and renames it into place under a file lock:
    concurrent callers wait for the first builder and reuse its folder; a folder is never
    visible half-written. ``manifest`` is written as ``unirl_preset.json`` (with
    ``model_index.json`` it marks the folder complete).
    """
    final = root / name
    if _is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{name}.lock"):
        if _is_complete(final, marker):
            return final
        if final.exists():
            raise ModelSourceError(
                f"preset folder {final} exists but is incomplete (no {MANIFEST}); delete it "
                "and retry (UniRL never leaves a half-written preset, so something else wrote there)"
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            write(tmp)
            (tmp / MANIFEST).write_text(json.dumps(dict(manifest), indent=2, sort_keys=True))
            try:
                os.replace(tmp, final)
            except OSError:
                # Another builder without a working lock (e.g. some network file systems) won.
                if not _is_complete(final, marker):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def tiny_preset_folder(
    spec: DataclassInstance,
    *,
    preset: str,
    folder_prefix: str,
    builder: int,
    corpus: list[str],
    write: Callable[[Path], None],
    cache_dir: str | Path | None = None,
    key_extra: Mapping[str, JSONValue] | None = None,
    marker: str = DIFFUSERS_MARKER,
) -> Path:
    """A family's ``tiny`` preset folder, ``<cache>/presets/<folder_prefix>-<key>``, built by
    ``write(folder)`` on first use (once per machine, under a file lock). The key is a short
    hash of ``key_extra``, the spec, the builder version, the corpus and the library versions,
    so a change to any of them builds a new folder. ``marker`` is the layout's file that,
    with the manifest, marks the folder complete (``config.json`` for a transformers model)."""
    payload = {
        **dict(key_extra or {}),
        "spec": dataclasses.asdict(spec),
        "builder": builder,
        "corpus": hashlib.sha256("\n".join(corpus).encode()).hexdigest(),
        "versions": library_versions(),
    }
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    root = (Path(cache_dir).expanduser() if cache_dir is not None else cache_root()) / "presets"
    manifest: JSONDict = {
        "preset": preset,
        "key": key,
        "builder": builder,
        "spec": dataclasses.asdict(spec),
    }
    return build_cached(root, f"{folder_prefix}-{key}", write, manifest, marker=marker)


def family_tiny_preset_folder(
    family: str,
    spec: DataclassInstance,
    *,
    builder: int,
    write: Callable[[Path], None],
    cache_dir: str | Path | None = None,
) -> Path:
    """:func:`tiny_preset_folder` named for ``family`` (e.g. ``qwen-image``): the folder
    ``<cache>/presets/<family>-tiny-<key>``, the manifest's preset ``<family>-tiny``, the key
    over ``{"family": family}``, the spec, ``builder`` and the bundled prompt corpus."""
    return tiny_preset_folder(
        spec,
        preset=f"{family}-{TINY}",
        folder_prefix=f"{family}-{TINY}",
        builder=builder,
        corpus=corpus_lines(),
        write=write,
        cache_dir=cache_dir,
        key_extra={"family": family},
    )


@dataclass(frozen=True, kw_only=True)
class ModelSources:
    """How one family names its sources: its label, ``*-arch`` presets and the diffusers
    sub-folders a hub snapshot is restricted to (so single-file checkpoints that some
    repositories also ship are not fetched)."""

    family: str
    arch_presets: tuple[str, ...]
    components: tuple[str, ...]

    @property
    def preset_names(self) -> tuple[str, ...]:
        return (TINY, *self.arch_presets)

    def not_found(self, path: str, why: str) -> ModelSourceError:
        arch = " or ".join(f"path={name}" for name in self.arch_presets)
        return ModelSourceError(
            f"model path {path!r}: {why}. Without network access use a preset: path=tiny (toy "
            f"{self.family} built locally, for tests and the quick-start) or {arch} (random "
            "weights at the real shapes, for benchmarks); or point the PRETRAINED_MODEL "
            "environment variable (the recipes' bundle.path) at a local diffusers folder."
        )

    def classify(self, path_or_preset: str) -> tuple[str, str]:
        """``(kind, name)`` with kind ``tiny`` | ``arch`` | ``folder`` | ``hub``, without
        building, loading or downloading anything (what ``dry_run`` checks). A hub id is taken
        on trust here; loading it fails fast offline."""
        name = str(path_or_preset).strip()
        if name == TINY:
            return "tiny", name
        if name in self.arch_presets:
            return "arch", name
        local = Path(name).expanduser()
        if local.is_dir():
            if not (local / "model_index.json").is_file() and not (local / "transformer").is_dir():
                raise self.not_found(
                    name,
                    f"the folder is not a diffusers {self.family} layout (no model_index.json or "
                    "transformer/)",
                )
            return "folder", str(local)
        if not _HUB_ID.match(name) or name.startswith((".", "/", "~")):
            raise self.not_found(
                name, "no such local folder, and it is not a hub id of the form 'org/name'"
            )
        return "hub", name

    def arch_spec(self, specs: Mapping[str, Callable[[], SpecT]], name: str) -> SpecT:
        """The spec of the ``*-arch`` preset ``name`` from the family's ``specs``."""
        if name not in specs:
            raise KeyError(f"unknown {self.family} arch preset {name!r}; known: {sorted(specs)}")
        return specs[name]()

    def resolve(
        self, path_or_preset: str, *, tiny: Callable[[], Path], arch: Callable[[str], SpecT]
    ) -> Path | SpecT:
        """Where the weights of ``path_or_preset`` are: ``tiny()`` (the cached tiny folder),
        ``arch(name)`` (an arch spec, built in memory later), a local folder, or a hub
        snapshot (local cache first; fails fast offline with :class:`ModelSourceError`)."""
        kind, name = self.classify(path_or_preset)
        if kind == "tiny":
            return tiny()
        if kind == "arch":
            return arch(name)
        if kind == "folder":
            return Path(name)
        return self.snapshot(name)

    def _patterns(self) -> list[str]:
        return ["model_index.json", *(f"{c}/*" for c in self.components)]

    def cached_snapshot(self, name: str) -> Path | None:
        """The hub checkpoint ``name`` from the local Hugging Face cache, or None."""
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(
                snapshot_download(name, allow_patterns=self._patterns(), local_files_only=True)
            )
        except (LocalEntryNotFoundError, OSError, ValueError):
            return None

    def snapshot(self, name: str) -> Path:
        """The hub checkpoint ``name``: the local cache first, then a download; fails fast with
        :class:`ModelSourceError` when ``HF_HUB_OFFLINE=1`` or the hub is unreachable."""
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
            return Path(snapshot_download(name, allow_patterns=self._patterns()))
        except Exception as exc:  # network, auth (gated repo) or missing repo: all mean "not here"
            raise self.not_found(
                name, f"not cached locally and the download failed ({type(exc).__name__}: {exc})"
            ) from exc

    def component_configs(self, folder: Path, parts: tuple[str, ...]) -> list[dict] | None:
        """``config.json`` of each sub-folder in ``parts`` (None when one is unreadable)."""
        try:
            return [json.loads((folder / part / "config.json").read_text()) for part in parts]
        except (OSError, ValueError):
            return None

    def architecture_configs(
        self,
        path_or_preset: str,
        *,
        tiny: Callable[[], tuple[ConfigDict, ConfigDict]],
        arch: Callable[[str], ModelConfigs],
    ) -> tuple[ConfigDict, ConfigDict] | None:
        """``(transformer config, VAE config)`` of a source, read without building weights:
        ``tiny()`` for the tiny preset, ``arch(name)`` (a spec with ``transformer`` and
        ``vae`` dicts) for an ``*-arch`` preset, the folder's ``config.json`` files otherwise;
        None for a hub checkpoint that is not in the local cache (checked when it loads)."""
        kind, name = self.classify(path_or_preset)
        if kind == "tiny":
            return tiny()
        if kind == "arch":
            spec = arch(name)
            return dict(spec.transformer), dict(spec.vae)
        folder = Path(name) if kind == "folder" else self.cached_snapshot(name)
        if folder is None:
            return None
        configs = self.component_configs(folder, ("transformer", "vae"))
        return None if configs is None else (configs[0], configs[1])
