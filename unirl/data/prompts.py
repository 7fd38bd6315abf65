"""Prompt files (``.txt`` / ``.jsonl`` / ``.json``) -> ``PromptExample`` lists.

Object schema (``.jsonl`` lines, ``.json`` list items)::

    {"prompt": "a sign that says \\"OPEN\\"",          # required, non-empty string
     "metadata": {"target_text": "OPEN"},             # optional dict
     "media": [{"modality": "image", "role": "reference", "uri": "imgs/a.png"}],  # optional
     "answer": "42"}                                  # any other key joins metadata

``media[].uri`` is resolved relative to the prompt file's folder and must exist.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACCEPTED_SUFFIXES = (".txt", ".jsonl", ".json")
_RESERVED = ("prompt", "metadata", "media")


class PromptFileError(ValueError):
    """A prompt file is unreadable or malformed; the message starts with ``file:line``."""


@dataclass(frozen=True)
class MediaRef:
    """A media input of one example: ``modality`` (e.g. "image"), ``role`` (e.g. "reference"),
    ``uri`` (absolute local path)."""

    modality: str
    role: str
    uri: str


@dataclass
class PromptExample:
    """One prompt with its metadata (``target_text``, ``answer``, ...) and media inputs."""

    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)
    media_refs: list[MediaRef] = field(default_factory=list)


def read_prompt_file(path: str | os.PathLike[str]) -> list[PromptExample]:
    """Read every example of ``path``; raises :class:`PromptFileError` naming ``file:line``."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in ACCEPTED_SUFFIXES:
        raise PromptFileError(
            f"{file}: unknown prompt file extension {file.suffix!r}; "
            f"use one of {', '.join(ACCEPTED_SUFFIXES)}"
        )
    if not file.is_file():
        raise PromptFileError(f"{file}: prompt file not found (check data_source.path / DATA_PATH)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{file}: not UTF-8 text ({exc})") from exc
    if suffix == ".txt":
        examples = _read_txt(text)
    elif suffix == ".jsonl":
        examples = _read_jsonl(file, text)
    else:
        examples = _read_json(file, text)
    if not examples:
        raise PromptFileError(
            f"{file}: contains no prompts (one prompt per line in .txt; objects with a "
            "'prompt' key in .jsonl / .json)"
        )
    return examples


def _read_txt(text: str) -> list[PromptExample]:
    return [PromptExample(prompt=line.strip()) for line in text.splitlines() if line.strip()]


def _read_jsonl(file: Path, text: str) -> list[PromptExample]:
    examples = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{file}:{lineno}: invalid JSON ({exc.msg})") from exc
        if not isinstance(item, dict):
            raise PromptFileError(
                f"{file}:{lineno}: each .jsonl line must be an object with a 'prompt' key, "
                f"got {type(item).__name__}"
            )
        examples.append(_from_object(item, file, lineno))
    return examples


def _read_json(file: Path, text: str) -> list[PromptExample]:
    """A top-level list of objects or strings; items are decoded one by one to know their line."""
    decoder = json.JSONDecoder()

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def fail(pos: int, msg: str) -> PromptFileError:
        return PromptFileError(f"{file}:{line_of(pos)}: {msg}")

    def skip_ws(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    pos = skip_ws(0)
    if pos >= len(text) or text[pos] != "[":
        raise fail(pos, "a .json prompt file must hold a list of objects or strings")
    pos = skip_ws(pos + 1)
    examples: list[PromptExample] = []
    if pos < len(text) and text[pos] == "]":
        pos += 1
    else:
        while True:
            try:
                item, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise PromptFileError(f"{file}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
            lineno = line_of(pos)
            if isinstance(item, str):
                if not item.strip():
                    raise fail(pos, "empty prompt string")
                examples.append(PromptExample(prompt=item.strip()))
            elif isinstance(item, dict):
                examples.append(_from_object(item, file, lineno))
            else:
                raise fail(pos, f"list items must be objects or strings, got {type(item).__name__}")
            pos = skip_ws(end)
            if pos < len(text) and text[pos] == ",":
                pos = skip_ws(pos + 1)
                continue
            if pos < len(text) and text[pos] == "]":
                pos += 1
                break
            raise fail(pos, "invalid JSON (expected ',' or ']' after a list item)")
    if skip_ws(pos) != len(text):
        raise fail(pos, "unexpected content after the top-level list")
    return examples


def _from_object(item: dict[str, object], file: Path, lineno: int) -> PromptExample:
    where = f"{file}:{lineno}"
    prompt = item.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptFileError(f"{where}: missing or empty 'prompt' string")
    metadata = item.get("metadata", {})
    if not isinstance(metadata, dict):
        raise PromptFileError(
            f"{where}: 'metadata' must be an object, got {type(metadata).__name__}"
        )
    metadata = dict(metadata)
    for key, value in item.items():
        if key in _RESERVED:
            continue
        if key in metadata:
            raise PromptFileError(f"{where}: key {key!r} is both top-level and inside 'metadata'")
        metadata[key] = value
    media = item.get("media", [])
    if not isinstance(media, list):
        raise PromptFileError(f"{where}: 'media' must be a list of objects")
    refs = [_media_ref(entry, file, where) for entry in media]
    return PromptExample(prompt=prompt.strip(), metadata=metadata, media_refs=refs)


def _media_ref(entry: object, file: Path, where: str) -> MediaRef:
    if not isinstance(entry, dict):
        raise PromptFileError(f"{where}: each 'media' entry must be an object")
    unknown = sorted(set(entry) - {"modality", "role", "uri"})
    if unknown:
        raise PromptFileError(
            f"{where}: unknown media keys {unknown}; use 'modality', 'role', 'uri'"
        )
    modality, uri = entry.get("modality"), entry.get("uri")
    role = entry.get("role", "condition")
    for key, value in (("modality", modality), ("role", role), ("uri", uri)):
        if not isinstance(value, str) or not value:
            raise PromptFileError(f"{where}: media {key!r} must be a non-empty string")
    assert isinstance(modality, str) and isinstance(uri, str)  # the loop above refuses others
    if "://" in uri:
        raise PromptFileError(
            f"{where}: media uri {uri!r} is a URL; only local paths are supported"
        )
    resolved = (file.parent / uri).resolve()
    if not resolved.exists():
        raise PromptFileError(f"{where}: media file not found: {uri!r} (resolved to {resolved})")
    if _is_lfs_pointer(resolved):
        raise PromptFileError(
            f"{where}: media file {uri!r} is a Git LFS pointer, not the {modality} itself (the "
            "repository was cloned without its LFS objects); run 'git lfs pull' in that "
            "repository, or point the file at the real media"
        )
    return MediaRef(modality=modality, role=role, uri=str(resolved))


LFS_POINTER_HEADER = b"version https://git-lfs.github.com/spec/"


def _is_lfs_pointer(path: Path) -> bool:
    """True when ``path`` is a Git LFS pointer file (a few lines of text standing in for the
    real file in a clone made without its LFS objects); reads the first bytes only."""
    try:
        with path.open("rb") as handle:
            return handle.read(len(LFS_POINTER_HEADER)) == LFS_POINTER_HEADER
    except OSError:
        return False
