"""What every autoregressive family's ``tiny`` preset shares: a ChatML tokenizer (byte-level
BPE trained locally on the bundled corpus plus arithmetic text, no download) and the
training lines it learns from."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from unirl.models.common.tiny import corpus_lines, train_byte_level_bpe

if TYPE_CHECKING:
    from transformers import Qwen2Tokenizer

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
CHAT_SPECIALS = (ENDOFTEXT, IM_START, IM_END)

# ChatML: one turn per message, then the assistant header when a generation prompt is asked
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    + IM_START
    + "{{ message['role'] }}\n{{ message['content'] }}"
    + IM_END
    + "\n{% endfor %}{% if add_generation_prompt %}"
    + IM_START
    + "assistant\n{% endif %}"
)


def arithmetic_lines(count: int = 400, seed: int = 0) -> list[str]:
    """Questions and boxed answers over small integers, so digits, operators and
    ``\\boxed{...}`` are common in the tokenizer's training text."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        lines.append(f"What is {a} {op} {b}? The answer is \\boxed{{{value}}}.")
    return lines


def tokenizer_lines() -> list[str]:
    """The bundled prompt corpus and :func:`arithmetic_lines`, each wrapped in a chat turn."""
    text = [*corpus_lines(), *arithmetic_lines()]
    return [f"{IM_START}user\n{line}{IM_END}\n{IM_START}assistant\n" for line in text]


def build_chat_tokenizer(
    vocab_size: int,
    *,
    lines: Sequence[str] | None = None,
    extra_specials: Sequence[str] = (),
    model_max_length: int = 4096,
) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` (byte-level BPE) with the ChatML template: ``<|endoftext|>`` is
    pad (id 0), ``<|im_end|>`` ends a turn and is the eos; ``<think>`` / ``</think>`` and
    ``extra_specials`` are special tokens too."""
    from transformers import Qwen2Tokenizer

    specials = [*CHAT_SPECIALS, THINK, END_THINK, *extra_specials]
    bpe = train_byte_level_bpe(
        list(lines if lines is not None else tokenizer_lines()),
        specials,
        vocab_size,
        lowercase=False,
    )
    tokenizer = Qwen2Tokenizer(
        tokenizer_object=bpe,
        unk_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
