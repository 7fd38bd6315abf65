"""Causal-LM bundles whose completions always run to ``max_new_tokens``, for benchmarks.

A throughput comparison between two frameworks needs both to generate the same number of
tokens. A random-init ``*-arch`` model draws an end-of-sequence token now and then (about
one draw in the vocabulary size per token and stop id), which would end some completions
early in one framework and not the other. ``FixedLengthQwen3Bundle`` is ``Qwen3Bundle``
with no stop token, the counterpart of ``min_new_tokens = max_new_tokens`` in transformers'
``generate`` (what TRL's ``GRPOTrainer`` uses): with ``sampling.stop: null`` every
completion is exactly ``sampling.max_new_tokens`` tokens long. Training recipes never use it.

``StopSetQwen3Bundle`` is the variable-length counterpart: the first ``stop_fraction`` of the
vocabulary (ids 1 .. ⌊stop_fraction·V⌋) are stop ids, so a random-init model stops at each
token with probability about ``stop_fraction``: lengths roughly geometric with a long tail up
to the cap, the shape where continuous batching matters. TRL's side of the benchmark sets the
same ids as its generation config's ``eos_token_id`` (``trl_grpo_compare.py --stop-fraction``).

``FixedLengthQwenVLBundle`` is the Qwen2.5-VL counterpart of ``FixedLengthQwen3Bundle`` (the
Qwen-VL shape of the benchmark, ``examples/vlm/qwen_vl_3b_grpo_bench.yaml``).
"""

from __future__ import annotations

from typing import Any

from unirl.models.common_ar.bundle import CausalLMBundle
from unirl.models.qwen3 import Qwen3Bundle
from unirl.models.qwen_vl import QwenVLBundle


def _drop_stop_tokens(bundle: CausalLMBundle) -> None:
    bundle.stop_token_ids = []
    # the prompt formatter keeps its own copy (an external engine reads it there)
    formatter = getattr(bundle, "prompts", None)
    if formatter is not None:
        formatter.stop_token_ids = []


class FixedLengthQwen3Bundle(Qwen3Bundle):
    """``Qwen3Bundle`` (same knobs) whose sampler stops only at ``max_new_tokens`` or a
    ``sampling.stop`` string: ``stop_token_ids`` is empty. The pad id is the tokenizer's as
    before."""

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        _drop_stop_tokens(self)


class FixedLengthQwenVLBundle(QwenVLBundle):
    """``QwenVLBundle`` (same knobs, ``image_size`` included) with no stop token, as
    :class:`FixedLengthQwen3Bundle`: every completion runs to ``max_new_tokens``."""

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        _drop_stop_tokens(self)


def stop_set(vocab_size: int, stop_fraction: float) -> list[int]:
    """The stop ids of ``StopSetQwen3Bundle``: 1 .. ⌊stop_fraction·vocab_size⌋ (id 0 kept)."""
    if not 0.0 < stop_fraction < 1.0:
        raise ValueError(f"bundle.stop_fraction must be in (0, 1), got {stop_fraction!r}")
    return list(range(1, 1 + max(1, int(stop_fraction * vocab_size))))


class StopSetQwen3Bundle(Qwen3Bundle):
    """``Qwen3Bundle`` (same knobs, plus ``stop_fraction``) whose stop ids are
    :func:`stop_set` of the model's vocabulary: variable lengths for benchmarks."""

    def __init__(self, *, stop_fraction: float, **knobs: Any) -> None:
        super().__init__(**knobs)
        config: Any = self.model.config  # the transformers model's PretrainedConfig
        self.stop_token_ids = stop_set(int(config.vocab_size), stop_fraction)
        formatter = getattr(self, "prompts", None)
        if formatter is not None:
            formatter.stop_token_ids = list(self.stop_token_ids)
