"""The one validation primitive every config dataclass uses."""

from __future__ import annotations


class UserFacingError(Exception):
    """An error whose message is the whole story for the user (it names the key, file or
    setting and the fix): the entrypoints print it as one line and exit 2, no traceback."""


class ConfigError(UserFacingError, ValueError):
    """A configuration value is wrong; the message names the field and the fix."""


def require(condition: object, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` is truthy."""
    if not condition:
        raise ConfigError(message)
