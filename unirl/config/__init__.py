"""Typed configuration: ``require``, the top-level ``RunConfig`` and cross-component validators."""

from __future__ import annotations

from unirl.config.require import ConfigError, UserFacingError, require

__all__ = ["ConfigError", "UserFacingError", "require"]
