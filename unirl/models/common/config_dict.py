"""The type of a ``config.json``-shaped dict: the architecture and scheduler configs every
family reads from a diffusers / transformers folder or declares in its presets, and hands to
``from_config`` or a transformers config class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JSONValue: TypeAlias = (
    str
    | int
    | float
    | bool
    | list["JSONValue"]
    | tuple["JSONValue", ...]
    | dict[str, "JSONValue"]
    | None
)
JSONDict: TypeAlias = dict[str, JSONValue]
"""A JSON object: a request payload's keys, a config file."""
ConfigDict: TypeAlias = JSONDict
"""One ``config.json`` (or ``scheduler_config.json``) read as a dict."""


def config_int(config: Mapping[str, JSONValue], key: str, default: int) -> int:
    """``int(config[key])``, ``default`` when the key is absent; a value that is not a number
    (or a numeric string) is refused, naming the key."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"config key {key!r}={value!r} is not a number")
    return int(value)


def config_float(config: Mapping[str, JSONValue], key: str, default: float) -> float:
    """``float(config[key])``, ``default`` when the key is absent (refused as in
    :func:`config_int`)."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"config key {key!r}={value!r} is not a number")
    return float(value)


def config_dict(config: Mapping[str, JSONValue], key: str) -> ConfigDict:
    """A copy of the nested config ``config[key]`` (refused, naming the key, when it is not
    a dict)."""
    value = config[key]
    if not isinstance(value, dict):
        raise TypeError(f"config key {key!r} must hold a dict, got {type(value).__name__}")
    return dict(value)
