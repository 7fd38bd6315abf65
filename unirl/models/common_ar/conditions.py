"""What a text track carries beside its tokens for the trainer to replay it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl.types import Conditions, batch_field


@dataclass(kw_only=True)
class PromptConditions(Conditions):
    """``prompt_lengths[N]``: prompt tokens at the start of each sample's packed row (the
    completion follows). ``temperature`` (shared): the temperature the rollout sampled with;
    the replayed policy is ``softmax(logits / temperature)`` (1 for a greedy rollout)."""

    prompt_lengths: torch.Tensor = batch_field("concat")
    temperature: float = batch_field("shared", default=1.0)

    def __post_init__(self) -> None:
        if self.prompt_lengths.ndim != 1:
            raise ValueError(
                f"PromptConditions.prompt_lengths must be [N], got {tuple(self.prompt_lengths.shape)}"
            )
        if not self.temperature > 0:
            raise ValueError(
                f"PromptConditions.temperature must be > 0 (the policy's), got {self.temperature}"
            )
