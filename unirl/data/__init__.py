"""Prompt data: prompt files -> ``PromptExample`` lists, and resumable prompt sources."""

from __future__ import annotations

from unirl.data.prompts import (
    ACCEPTED_SUFFIXES,
    MediaRef,
    PromptExample,
    PromptFileError,
    read_prompt_file,
)
from unirl.data.source import PromptFileSource

__all__ = [
    "ACCEPTED_SUFFIXES",
    "MediaRef",
    "PromptExample",
    "PromptFileError",
    "PromptFileSource",
    "read_prompt_file",
]
