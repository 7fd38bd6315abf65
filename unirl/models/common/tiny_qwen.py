"""A small Qwen-style tokenizer and chat template, built here without a download, for VLM
reward folders with random weights: the tests' tiny models and the benchmark's judges at
released shapes (``examples/benchmarks/make_vlm_reward.py``). A byte-level BPE trained on the
bundled prompt corpus, digits split as Qwen splits them, with Qwen's special tokens, wrapped
as ``Qwen2TokenizerFast``."""

from __future__ import annotations

import functools
from typing import Any

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Our own Qwen-style chat template: a default system turn, and an image or a video as one pad
# between the vision markers (the scorers expand the pads).
QWEN_STYLE_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.first and m.role != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    "<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def trained_bpe() -> str:
    """The trained BPE as JSON (trained once per process)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from unirl.models.common.tiny import corpus_lines

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),  # digits alone
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus_lines(), trainer)
    return bpe.to_str()


def qwen_tokenizer(
    template: str = QWEN_STYLE_TEMPLATE, special: tuple[str, ...] = (), plain: tuple[str, ...] = ()
) -> Any:
    """A ``Qwen2TokenizerFast`` over :func:`trained_bpe` with ``template`` as its chat
    template; ``special`` / ``plain``: tokens added as special / as ordinary tokens."""
    import transformers
    from tokenizers import Tokenizer

    # an alias transformers resolves lazily (the stubs do not list it)
    tok = transformers.Qwen2TokenizerFast(  # type: ignore[attr-defined]
        tokenizer_object=Tokenizer.from_str(trained_bpe()),
        unk_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if plain:
        tok.add_tokens(list(plain))
    tok.chat_template = template
    return tok
