"""Driver-side fakes the trainer loop tests share (``test_pe_loop``, ``test_pe_sglang``,
``test_unified_loop``, ``test_ar_sglang_adapter``): a fixed engine, a reward that drops one
sample, a stack that records what it trains on, a loss node without end-of-rollout metrics,
sampling ops that do nothing, and the ``rollout`` block of a policy served by a fake SGLang
text server."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from unirl.types import STATUS_DROPPED, RolloutReq, RolloutResp, RolloutTrack


class FixedEngine:
    """Answers every request with ``response()`` (a fresh response per call)."""

    def __init__(self, response: Callable[[], RolloutResp]) -> None:
        self.response = response

    def generate(self, req: RolloutReq) -> RolloutResp:
        return self.response()


class DroppingReward:
    """Scores a track with ``rewards`` (one per sample) and drops sample ``dropped``."""

    def __init__(self, rewards: list[float], *, dropped: int) -> None:
        self.rewards = rewards
        self.dropped = dropped

    def score(self, track: RolloutTrack) -> RolloutTrack:
        status = torch.zeros(len(track), dtype=torch.long)
        status[self.dropped] = STATUS_DROPPED
        return dataclasses.replace(track, rewards=torch.tensor(self.rewards), status=status)


class RecordingStack:
    """Records the track it is asked to train on (advantages attached)."""

    def __init__(self) -> None:
        self.seen: RolloutTrack | None = None

    def train_track(self, track: RolloutTrack, rollout_index: int) -> list[dict[str, Any]]:
        self.seen = track
        return [{"steps": [{"loss": 0.0}], "param_checksum": 1.0}]


class QuietAlgorithm:
    """A loss node with no end-of-rollout metrics (one empty dict per rank)."""

    def after_train(self, rollout_index: int) -> list[dict[str, float]]:
        return [{}]


class IdleOps:
    """Train ops whose sampling hooks do nothing."""

    def begin_sampling(self, mode: str) -> None: ...

    def end_sampling(self) -> None: ...


def served_text_rollout(bundle: dict[str, Any], client: Any) -> dict[str, Any]:
    """The ``rollout`` block of a policy served by SGLang's text engine, reached through
    ``client`` (a fake server) instead of a launched server; fp32, the read-back check on
    ``model.norm.weight``."""
    return {
        "_target_": "unirl.rollout.engine.sglang_llm.SGLangLLMEngine",
        "_recursive_": False,
        "model_path": "tiny",
        "bundle": dict(bundle),
        "launch": False,
        "dtype": "fp32",
        "check_names": ["model.norm.weight"],
        "client": client,
    }
