"""Encoded model inputs carried on a track; model families subclass ``Conditions``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types.batch import Batch, batch_field


@dataclass(kw_only=True)
class Conditions(Batch):
    """Base of every family's encoded conditions (per-sample tensors, concat on dim 0)."""


@dataclass(kw_only=True)
class TextEmbedConditions(Conditions):
    """A generic text condition: ``embeds[N, L, D]``, optional ``pooled[N, Dp]`` and ``mask[N, L]``."""

    embeds: torch.Tensor = batch_field("concat")
    pooled: torch.Tensor | None = batch_field("concat", default=None)
    mask: torch.Tensor | None = batch_field("concat", default=None)
