"""Typed configuration: ``require``, the top-level ``RunConfig`` and cross-component validators."""

from __future__ import annotations

from unirl.config.require import ConfigError, require

__all__ = ["ConfigError", "require"]
