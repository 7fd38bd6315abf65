"""A tiny Qwen-style tokenizer for the VLM reward tests, built here (nothing downloaded): a
byte-level BPE trained once on the bundled corpus, digits split as Qwen does, with Qwen's
special tokens, wrapped as ``Qwen2TokenizerFast`` with the test's own chat template."""

from __future__ import annotations

import functools

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


@functools.cache
def trained_bpe() -> str:
    """The trained BPE as JSON (trained once per test process)."""
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


def qwen_tokenizer(template: str, special: tuple[str, ...] = (), plain: tuple[str, ...] = ()):
    """A ``Qwen2TokenizerFast`` over :func:`trained_bpe` with ``template`` as its chat
    template; ``special`` / ``plain``: tokens added as special / as ordinary tokens."""
    import transformers
    from tokenizers import Tokenizer

    tok = transformers.Qwen2TokenizerFast(
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
