"""``ZImageConditions``: encoded prompts of one batch, one variable-length caption per sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch

from unirl.types import Conditions, Packed, batch_field

# The transformer pads every caption and image token run to a multiple of this (diffusers'
# SEQ_MULTI_OF).
SEQ_MULTIPLE = 32

T = TypeVar("T", int, torch.Tensor)


def padded(length: T) -> T:
    """``length`` (an int or a tensor of them) rounded up to a multiple of ``SEQ_MULTIPLE``."""
    return length + (-length) % SEQ_MULTIPLE


def _check_captions(name: str, value: object) -> None:
    if not isinstance(value, Packed) or value.values.ndim != 2:
        shape = tuple(value.values.shape) if isinstance(value, Packed) else type(value).__name__
        raise ValueError(
            f"ZImageConditions: {name} must be Packed captions with values [sum L, D], got {shape}"
        )


@dataclass(kw_only=True)
class ZImageConditions(Conditions):
    """``prompt_embeds``: one caption per sample, ``[L_i, D]`` Qwen3 hidden states of the
    prompt's real tokens (chat template included), packed on dim 0 (offsets on the host, so
    splitting a batch into the transformer's caption list reads no device value). The
    optional ``negative_prompt_embeds`` holds the negative prompt's caption per sample.

    ``Packed`` fields split and merge with the generic ``Batch`` machinery: rows of any
    lengths concatenate without padding, which is how the transformer takes them.
    """

    prompt_embeds: Packed = batch_field("packed")
    negative_prompt_embeds: Packed | None = batch_field("packed", default=None)

    def __post_init__(self) -> None:
        _check_captions("prompt_embeds", self.prompt_embeds)
        neg = self.negative_prompt_embeds
        if neg is None:
            return
        _check_captions("negative_prompt_embeds", neg)
        if len(neg) != len(self.prompt_embeds) or neg.values.shape[1] != self.width:
            raise ValueError(
                "ZImageConditions: negative_prompt_embeds must have the rows and width of "
                f"prompt_embeds, got {len(neg)} x {neg.values.shape[1]} vs "
                f"{len(self.prompt_embeds)} x {self.width}"
            )

    @property
    def width(self) -> int:
        """``D``, the caption feature width."""
        return int(self.prompt_embeds.values.shape[1])

    @property
    def has_negative(self) -> bool:
        return self.negative_prompt_embeds is not None

    def padded_lengths(self) -> torch.Tensor:
        """``long[N]`` (host): each caption's length as the transformer pads it (a multiple of
        ``SEQ_MULTIPLE``); read from the packed offsets, no device value."""
        return padded(self.prompt_embeds.offsets.diff())

    def captions(self) -> list[torch.Tensor]:
        """The prompt captions as the transformer takes them: a list of ``[L_i, D]`` views."""
        return self.prompt_embeds.to_list()

    def positive(self) -> ZImageConditions:
        """The prompt rows only."""
        return ZImageConditions(prompt_embeds=self.prompt_embeds)

    def negative(self) -> ZImageConditions:
        """The negative rows as plain conditions; raises ``ValueError`` if there are none."""
        if self.negative_prompt_embeds is None:
            raise ValueError(
                "ZImageConditions.negative: no negative captions (encode with negative=True)"
            )
        return ZImageConditions(prompt_embeds=self.negative_prompt_embeds)
