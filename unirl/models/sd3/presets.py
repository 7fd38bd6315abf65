"""Named SD3 sources that need no download, and the one resolver every loader goes through.

- ``tiny``: a random-init toy stack (~1 M parameters) saved once into a cache folder in the
  diffusers layout; ``StableDiffusion3Pipeline.from_pretrained(folder)`` loads it.
- ``sd3.5-medium-arch``: random weights at the real SD3.5-Medium shapes, built in memory.

``resolve_model_source`` maps a recipe's ``path`` to a local folder or an arch spec; a hub
id is looked up in the local Hugging Face cache first and fails fast offline.
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
from collections.abc import Iterator
from pathlib import Path

from unirl.models.sd3.arch import ARCH_SPECS, SD3ArchSpec
from unirl.models.sd3.tiny import TINY_BUILDER_VERSION, TinySD3Spec, corpus_lines, write_tiny_sd3

TINY = "tiny"
SD35_MEDIUM_ARCH = "sd3.5-medium-arch"
PRESET_NAMES: tuple[str, ...] = (TINY, *ARCH_SPECS)
MANIFEST = "unirl_preset.json"

# The diffusers sub-folders SD3 needs; a hub snapshot is restricted to them so the
# single-file checkpoints some repos also ship are not fetched.
SD3_COMPONENTS = (
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "tokenizer",
    "tokenizer_2",
    "tokenizer_3",
    "scheduler",
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelSourceError(FileNotFoundError):
    """A model path names neither a preset, a local folder, nor a reachable hub checkpoint."""


def cache_root() -> Path:
    """``$UNIRL_CACHE`` if set, else ``~/.cache/unirl``."""
    env = os.environ.get("UNIRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "unirl"


def tiny_preset_key(spec: TinySD3Spec) -> str:
    """Short hash of the spec, the builder version, the corpus and the library versions."""
    import diffusers
    import tokenizers
    import torch
    import transformers

    payload = {
        "spec": dataclasses.asdict(spec),
        "builder": TINY_BUILDER_VERSION,
        "corpus": hashlib.sha256("\n".join(corpus_lines()).encode()).hexdigest(),
        "versions": [
            torch.__version__,
            diffusers.__version__,
            transformers.__version__,
            tokenizers.__version__,
        ],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _is_complete(folder: Path) -> bool:
    return (folder / MANIFEST).is_file() and (folder / "model_index.json").is_file()


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


def tiny_preset_path(
    spec: TinySD3Spec | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """The folder of the ``tiny`` preset, built on first use.

    Lives at ``<cache>/presets/tiny-<key>`` (``<cache>`` = ``cache_dir`` or :func:`cache_root`).
    The build writes into a temporary sibling and renames it into place, under a file lock:
    concurrent callers wait for the first builder and reuse its folder; a folder is never
    visible half-written.
    """
    spec = spec or TinySD3Spec()
    root = (Path(cache_dir).expanduser() if cache_dir is not None else cache_root()) / "presets"
    key = tiny_preset_key(spec)
    final = root / f"tiny-{key}"
    if _is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".tiny-{key}.lock"):
        if _is_complete(final):
            return final
        if final.exists():
            raise ModelSourceError(
                f"tiny preset folder {final} exists but is incomplete (no {MANIFEST}); delete it "
                "and retry (UniRL never leaves a half-written preset, so something else wrote there)"
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{key}.tmp-", dir=root))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            write_tiny_sd3(tmp, spec)
            manifest = {
                "preset": TINY,
                "key": key,
                "builder": TINY_BUILDER_VERSION,
                "spec": dataclasses.asdict(spec),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
            try:
                os.replace(tmp, final)
            except OSError:
                # Another builder without a working lock (e.g. some network file systems) won.
                if not _is_complete(final):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def arch_spec(name: str) -> SD3ArchSpec:
    """The architecture spec of an ``*-arch`` preset."""
    if name not in ARCH_SPECS:
        raise KeyError(f"unknown SD3 arch preset {name!r}; known: {sorted(ARCH_SPECS)}")
    return ARCH_SPECS[name]()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _not_found(path: str, why: str) -> ModelSourceError:
    return ModelSourceError(
        f"model path {path!r}: {why}. Without network access use a preset: path=tiny (toy SD3 "
        f"built locally, for tests and the quick-start) or path={SD35_MEDIUM_ARCH} (random weights "
        "at the real shapes, for benchmarks); or point the PRETRAINED_MODEL environment variable "
        "(the recipes' bundle.path) at a local diffusers folder."
    )


def classify_model_source(path_or_preset: str) -> tuple[str, str]:
    """``(kind, name)`` with kind ``tiny`` | ``arch`` | ``folder`` | ``hub``, without building,
    loading or downloading anything (what ``dry_run`` checks). Raises
    :class:`ModelSourceError` for a name that is none of them or a folder that is not a
    diffusers SD3 layout. A hub id is taken on trust here (the recipes name real checkpoints
    that a machine without the hub cannot see); loading it fails fast offline."""
    name = str(path_or_preset).strip()
    if name == TINY:
        return "tiny", name
    if name in ARCH_SPECS:
        return "arch", name
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "model_index.json").is_file() and not (local / "transformer").is_dir():
            raise _not_found(
                name,
                "the folder is not a diffusers SD3 layout (no model_index.json or transformer/)",
            )
        return "folder", str(local)
    if not _HUB_ID.match(name) or name.startswith((".", "/", "~")):
        raise _not_found(
            name, "no such local folder, and it is not a hub id of the form 'org/name'"
        )
    return "hub", name


def _cached_snapshot(name: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["model_index.json", *(f"{c}/*" for c in SD3_COMPONENTS)]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def architecture_configs(path_or_preset: str) -> tuple[dict, dict] | None:
    """``(transformer config, VAE config)`` of a source, read without building weights; None
    for a hub checkpoint that is not in the local cache (checked when the bundle loads)."""
    kind, name = classify_model_source(path_or_preset)
    if kind == "tiny":
        from unirl.models.sd3.tiny import transformer_config, vae_config

        spec = TinySD3Spec()
        return transformer_config(spec), vae_config(spec)
    if kind == "arch":
        arch = arch_spec(name)
        return dict(arch.transformer), dict(arch.vae)
    folder = Path(name) if kind == "folder" else _cached_snapshot(name)
    if folder is None:
        return None
    try:
        return tuple(  # type: ignore[return-value]
            json.loads((folder / part / "config.json").read_text())
            for part in ("transformer", "vae")
        )
    except (OSError, ValueError):
        return None


def resolve_model_source(path_or_preset: str) -> Path | SD3ArchSpec:
    """``tiny`` -> cached local folder; ``sd3.5-medium-arch`` -> :class:`SD3ArchSpec`;
    an existing folder -> itself; ``org/name`` -> a hub snapshot (local cache first).

    A hub id that is not cached fails fast with :class:`ModelSourceError` when
    ``HF_HUB_OFFLINE=1`` or the hub is unreachable; the message names the presets and
    ``PRETRAINED_MODEL``.
    """
    kind, name = classify_model_source(path_or_preset)
    if kind == "tiny":
        return tiny_preset_path()
    if kind == "arch":
        return arch_spec(name)
    if kind == "folder":
        return Path(name)
    cached = _cached_snapshot(name)
    if cached is not None:
        return cached
    if _offline():
        raise _not_found(
            name, "no such local folder, not in the local Hugging Face cache, and HF_HUB_OFFLINE=1"
        )

    from huggingface_hub import snapshot_download

    patterns = ["model_index.json", *(f"{c}/*" for c in SD3_COMPONENTS)]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:  # network, auth (gated repo) or missing repo: all mean "not here"
        raise _not_found(
            name, f"not cached locally and the download failed ({type(exc).__name__}: {exc})"
        ) from exc
