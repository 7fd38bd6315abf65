"""Canonical precision names: ``fp32``, ``bf16``, ``fp16`` (long torch names accepted)."""

from __future__ import annotations

import torch

from unirl.config.require import ConfigError

CANONICAL_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def canonical_precision(name: str, field: str) -> str:
    """The canonical name for ``name``; raises ``ConfigError`` naming ``field`` otherwise."""
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in CANONICAL_DTYPES:
        raise ConfigError(
            f"{field}: unknown precision {name!r}; use one of {sorted(CANONICAL_DTYPES)}"
        )
    return key


def parse_dtype(name: str | torch.dtype, field: str) -> torch.dtype:
    """``torch.dtype`` for a precision name (or a dtype passed through)."""
    if isinstance(name, torch.dtype):
        return name
    return CANONICAL_DTYPES[canonical_precision(name, field)]
