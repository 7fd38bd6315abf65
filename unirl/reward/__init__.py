"""Rewards: the backend contract, the service that attaches rewards to tracks, weighting."""

from __future__ import annotations

from unirl.reward.base import (
    EditRewardBackend,
    RewardBackend,
    RewardError,
    ScoreResult,
    TextRewardBackend,
)
from unirl.reward.multi import WeightedRewardBackend, batch_zscore
from unirl.reward.remote import RemoteRewardBackend
from unirl.reward.service import RewardService

__all__ = [
    "EditRewardBackend",
    "RemoteRewardBackend",
    "RewardBackend",
    "RewardError",
    "RewardService",
    "ScoreResult",
    "TextRewardBackend",
    "WeightedRewardBackend",
    "batch_zscore",
]
