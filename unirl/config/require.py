"""The one validation primitive every config dataclass uses."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field and the fix."""


def require(condition: object, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` is truthy."""
    if not condition:
        raise ConfigError(message)
