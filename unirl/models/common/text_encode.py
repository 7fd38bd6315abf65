"""Pieces of prompt encoding every family shares: where a text encoder's weights live, and a
prompt rendered as one user turn of a tokenizer's chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s (first) parameter: where its inputs must go."""
    return next(module.parameters()).device


def module_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype of ``module``'s (first) parameter."""
    return next(module.parameters()).dtype


def user_turn(tokenizer: PreTrainedTokenizerBase, text: str, *, enable_thinking: bool) -> str:
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


_WARNED_TRUNCATION: set[str] = set()


def warn_truncated_prompts(
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    max_length: int,
    key: str,
    *,
    add_special_tokens: bool = True,
) -> int:
    """Count the prompts of ``texts`` longer than ``max_length`` tokens (what the encoder's
    ``truncation=True`` cuts) and, the first time this process meets one for ``key`` (the
    recipe key that sets the length, e.g. ``bundle.max_sequence_length``), print one warning
    line naming the longest prompt and the fix. Returns the count."""
    lengths = [
        len(ids) for ids in tokenizer(list(texts), add_special_tokens=add_special_tokens).input_ids
    ]
    return warn_long_prompts(lengths, texts, max_length, key)


def warn_long_prompts(lengths: list[int], texts: list[str], max_length: int, key: str) -> int:
    """:func:`warn_truncated_prompts` from the token ``lengths`` a family counted itself (the
    tokens its limit applies to, e.g. after a chat template's dropped prefix); ``texts`` are
    the prompts as the user wrote them, for the warning to show."""
    over = [i for i, n in enumerate(lengths) if n > max_length]
    if over and key not in _WARNED_TRUNCATION:
        _WARNED_TRUNCATION.add(key)
        longest = max(over, key=lambda i: lengths[i])
        shown = texts[longest] if len(texts[longest]) <= 80 else texts[longest][:77] + "..."
        print(
            f"[unirl] warning: {len(over)} of {len(texts)} prompts are longer than "
            f"{key}={max_length} tokens and are cut to it (the longest, {lengths[longest]} "
            f"tokens: {shown!r}); raise {key} or shorten the prompts (warned once per process)",
            flush=True,
        )
    return len(over)


def token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """The id of the one vocabulary entry ``token`` (``convert_tokens_to_ids`` of a single
    token, refused when the tokenizer does not map it to one id)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise TypeError(f"the tokenizer maps {token!r} to {found!r}, not to one token id")
    return found
