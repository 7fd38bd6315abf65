"""DAPO's overlong reward shaping (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", eq. 13; docs/math.md, "DAPO"): a soft penalty on a completion's
length ``L`` (tokens) in the last ``cache_tokens`` tokens before ``max_tokens``:

    R(L) = 0                                         L ≤ L_max − L_cache
         = ((L_max − L_cache) − L) / L_cache         L_max − L_cache < L ≤ L_max
         = −1                                        L > L_max

Added to the task reward as a component of a ``WeightedRewardBackend`` (weight 1 in the
paper). The length is the engine's ``response_tokens`` of each sample's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

from unirl.config import require
from unirl.reward.base import RewardError, ScoreResult, TextRewardBackend, as_scores, check_lengths


def overlong_penalty(length: int, max_tokens: int, cache_tokens: int) -> float:
    """``R(L)`` above; 0 up to ``max_tokens − cache_tokens``, −1 past ``max_tokens``."""
    start = max_tokens - cache_tokens
    if length <= start:
        return 0.0
    if length <= max_tokens:
        return (start - length) / cache_tokens
    return -1.0


@dataclass(kw_only=True)
class OverlongPenalty(TextRewardBackend):
    """DAPO's soft overlong penalty: 0 for a completion of at most ``max_tokens`` −
    ``cache_tokens`` tokens, falling linearly to −1 at ``max_tokens`` (L_max: the generation
    budget, ``sampling.max_new_tokens``), −1 beyond; ``cache_tokens`` (L_cache) is the width of
    the soft band; ``name``: the component's name."""

    name: str = "overlong"
    """The component's name (its key in the reward's components and metrics)."""
    max_tokens: int
    """L_max: the generation budget (``sampling.max_new_tokens``); −1 at and past it."""
    cache_tokens: int
    """L_cache: the width of the soft band before ``max_tokens`` where the penalty falls
    linearly from 0 to −1."""

    def __post_init__(self) -> None:
        require(bool(self.name), "OverlongPenalty.name must be non-empty")
        require(
            self.max_tokens >= 1, f"OverlongPenalty.max_tokens must be >= 1, got {self.max_tokens}"
        )
        require(
            1 <= self.cache_tokens <= self.max_tokens,
            f"OverlongPenalty.cache_tokens must be in [1, max_tokens={self.max_tokens}] (the "
            f"soft band before max_tokens), got {self.cache_tokens}",
        )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score_texts(
        self, texts: list[str], prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        check_lengths(len(texts), type(self).__name__, prompts=prompts, metadata=metadata)
        scores = []
        for i, meta in enumerate(metadata):
            if "response_tokens" not in meta:
                raise RewardError(
                    f"OverlongPenalty: sample {i} has no response_tokens in its metadata (the "
                    "text engine records it); score a text track sampled by a unirl engine"
                )
            scores.append(
                overlong_penalty(int(meta["response_tokens"]), self.max_tokens, self.cache_tokens)
            )
        return ScoreResult(scores={self.name: as_scores(scores)})
