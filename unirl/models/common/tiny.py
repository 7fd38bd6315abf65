"""Pieces every family's ``tiny`` preset shares: the bundled prompt corpus and a byte-level BPE
tokenizer trained on it locally (no download), so toy stacks tokenise real prompts."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from unirl.models.common.progress import hf_progress_bars_disabled

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def corpus_lines() -> list[str]:
    """The bundled prompt corpus (``tiny_corpus.txt``) the tiny tokenizers are trained on."""
    text = resources.files("unirl.models.common").joinpath("tiny_corpus.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def train_byte_level_bpe(
    lines: Sequence[str], specials: Sequence[str], vocab_size: int, *, lowercase: bool
) -> Tokenizer:
    """A ``tokenizers.Tokenizer``: byte-level BPE trained on ``lines`` with ``specials`` first
    in the vocabulary (ids 0, 1, ...). ``lowercase`` adds a lower-casing normaliser (CLIP)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(lines), trainer)
    return tok


class SavablePipeline(Protocol):
    """A diffusers pipeline, as far as writing a preset folder goes."""

    def save_pretrained(self, save_directory: str, *, safe_serialization: bool) -> None: ...


def save_pipeline(pipe: SavablePipeline, folder: Path) -> None:
    """``save_pretrained`` a (tiny) diffusers pipeline into ``folder`` as safetensors, with
    the progress bars off: what every tiny preset's ``write`` does with its built stack."""
    with hf_progress_bars_disabled():
        pipe.save_pretrained(str(folder), safe_serialization=True)
