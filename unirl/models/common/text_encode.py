"""Pieces of prompt encoding every family shares: where a text encoder's weights live, and a
prompt rendered as one user turn of a tokenizer's chat template."""

from __future__ import annotations

from typing import Any

import torch


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s (first) parameter: where its inputs must go."""
    return next(module.parameters()).device


def module_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype of ``module``'s (first) parameter."""
    return next(module.parameters()).dtype


def user_turn(tokenizer: Any, text: str, *, enable_thinking: bool) -> str:
    """``text`` as one user turn of the tokenizer's chat template with the generation prompt
    open (the assistant header). Qwen3 templates read ``enable_thinking`` (off: an empty think
    block follows the header); a template without that switch ignores it."""
    return str(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
    )
