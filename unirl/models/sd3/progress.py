"""Kept for imports written before the helper moved to ``unirl.models.common.progress``."""

from __future__ import annotations

from unirl.models.common.progress import hf_progress_bars_disabled

__all__ = ["hf_progress_bars_disabled"]
