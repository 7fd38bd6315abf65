"""Causal-LM bundles whose completions always run to ``max_new_tokens``, for benchmarks.

A throughput comparison between two frameworks needs both to generate the same number of
tokens. A random-init ``*-arch`` model draws an end-of-sequence token now and then (about
one draw in the vocabulary size per token and stop id), which would end some completions
early in one framework and not the other. ``FixedLengthQwen3Bundle`` is ``Qwen3Bundle``
with no stop token, the counterpart of ``min_new_tokens = max_new_tokens`` in transformers'
``generate`` (what TRL's ``GRPOTrainer`` uses): with ``sampling.stop: null`` every
completion is exactly ``sampling.max_new_tokens`` tokens long. Training recipes never use it.
"""

from __future__ import annotations

from typing import Any

from unirl.models.qwen3 import Qwen3Bundle


class FixedLengthQwen3Bundle(Qwen3Bundle):
    """``Qwen3Bundle`` (same knobs) whose sampler stops only at ``max_new_tokens`` or a
    ``sampling.stop`` string: ``stop_token_ids`` is empty. The pad id is the tokenizer's as
    before."""

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.stop_token_ids: list[int] = []
        # the prompt formatter keeps its own copy (an external engine reads it there)
        formatter = getattr(self, "prompts", None)
        if formatter is not None:
            formatter.stop_token_ids = []
