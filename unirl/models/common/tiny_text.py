"""The tiny presets' Qwen-family text stack, written once (Qwen-Image's Qwen2.5-VL, FLUX.2's
and Z-Image's Qwen3): a ``Qwen2Tokenizer`` over a byte-level BPE trained locally on the
bundled corpus wrapped in the text the pipeline tokenises, and the text model's config at a
tiny spec's sizes. Ids stay below the spec's ``vocab_size``, so the tokenizer is also valid
in the real vocabularies (the ``*-arch`` presets use it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.text_encode import user_turn
from unirl.models.common.tiny import corpus_lines, train_byte_level_bpe

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen2Tokenizer

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
# Qwen3's special tokens, ids 0..4: <|endoftext|> pads, <|im_end|> ends a turn
QWEN3_SPECIALS = (ENDOFTEXT, IM_START, IM_END, THINK, END_THINK)

# Plain chat turns as the released Qwen3 template renders them (system / user / assistant
# messages, no tools): each turn is ``<|im_start|>{role}\n{content}<|im_end|>\n``; the
# generation prompt opens the assistant turn and, only when ``enable_thinking`` is false,
# closes an empty think block.
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def qwen3_turn(prompt: str, *, enable_thinking: bool) -> str:
    """What :data:`QWEN3_CHAT_TEMPLATE` renders for one user ``prompt`` with the generation
    prompt open (the text a pipeline tokenises, and the tiny tokenizer's training form)."""
    think = "" if enable_thinking else f"{THINK}\n\n{END_THINK}\n\n"
    return f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n{think}"


def qwen_bpe_tokenizer(
    lines: Sequence[str], *, specials: Sequence[str], vocab_size: int, model_max_length: int
) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer`` over a byte-level BPE trained on ``lines`` with ``specials`` first
    (ids 0, 1, ...): ``<|endoftext|>`` is the pad and unknown token, ``<|im_end|>`` the eos."""
    from transformers import Qwen2Tokenizer

    bpe = train_byte_level_bpe(list(lines), list(specials), vocab_size, lowercase=False)
    return Qwen2Tokenizer(
        tokenizer_object=bpe,
        unk_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=model_max_length,
    )


def qwen3_chat_tokenizer(
    *,
    enable_thinking: bool,
    vocab_size: int,
    model_max_length: int,
    lines: Sequence[str] | None = None,
) -> Qwen2Tokenizer:
    """:func:`qwen_bpe_tokenizer` with Qwen3's specials and :data:`QWEN3_CHAT_TEMPLATE`,
    trained on each corpus line (or ``lines``) as the user turn the pipeline tokenises
    (:func:`qwen3_turn` with its ``enable_thinking``). That the template renders exactly this
    turn is checked here."""
    text = corpus_lines() if lines is None else lines
    tokenizer = qwen_bpe_tokenizer(
        [qwen3_turn(line, enable_thinking=enable_thinking) for line in text],
        specials=QWEN3_SPECIALS,
        vocab_size=vocab_size,
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    probe = "a red fox"
    rendered = user_turn(tokenizer, probe, enable_thinking=enable_thinking)
    expected = qwen3_turn(probe, enable_thinking=enable_thinking)
    if rendered != expected:
        raise ValueError(
            f"the tiny chat template renders {rendered!r}, not the turn the tokenizer was "
            f"trained on ({expected!r})"
        )
    return tokenizer


def tiny_qwen_text_config(spec: Any, tokenizer: PreTrainedTokenizerBase) -> ConfigDict:
    """The text model's config fields at a tiny spec's sizes (``vocab_size``, ``text_hidden``,
    ``text_intermediate``, ``text_layers``, ``text_heads``, ``text_kv_heads``), 2048
    positions, default RoPE (θ = 10⁶), no bos, the tokenizer's eos and pad ids; a family adds
    or replaces what its model needs (head dim, tied embeddings, M-RoPE sections)."""
    return {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.text_hidden,
        "intermediate_size": spec.text_intermediate,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_kv_heads,
        "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
