"""Video rewards: image scorers applied per frame and aggregated over time, a temporal
consistency score (frame-to-frame change), and a video PickScore (frame embeddings pooled
over time, the mean-pooling of CLIP4Clip, scored against the prompt like PickScore)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from unirl.config import require
from unirl.config.typecheck import PositiveInt
from unirl.reward.base import (
    RewardBackend,
    RewardError,
    ScoreResult,
    as_backend,
    as_scores,
    check_video_call,
    check_videos,
)
from unirl.reward.local.clip_score import clip_image_embeds, clip_text_embeds
from unirl.reward.local.pickscore import PickScore

AGGREGATES = ("mean", "min")


def frame_indices(num_frames: int, stride: int) -> list[int]:
    """Frames ``0, stride, 2·stride, …`` and always the last one (the end of a clip matters)."""
    chosen = list(range(0, num_frames, stride))
    if chosen[-1] != num_frames - 1:
        chosen.append(num_frames - 1)
    return chosen


@dataclass(kw_only=True)
class PerFrame(RewardBackend):
    """``scorer`` (any image reward) on the frames ``0, frame_stride, …, T-1`` of each video,
    then ``mean`` or ``min`` over those frames per component (``aggregate``). A video with a
    failed frame (NaN) fails as a whole, with that frame's error. ``frame_stride``: score
    every this many frames (the last frame always included)."""

    scorer: Any
    aggregate: str = "mean"
    frame_stride: PositiveInt = 1

    def __post_init__(self) -> None:
        self.scorer = as_backend(self.scorer, "PerFrame.scorer")
        require(
            self.aggregate in AGGREGATES,
            f"PerFrame.aggregate={self.aggregate!r}: use one of {', '.join(AGGREGATES)}",
        )
        require(self.frame_stride >= 1, "PerFrame.frame_stride must be >= 1")

    @property
    def names(self) -> tuple[str, ...]:
        return self.scorer.names

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        return self.scorer.score(images, prompts, metadata)

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(prompts)
        frames = check_video_call(frames, prompts, metadata, "PerFrame")
        chosen = frame_indices(frames.shape[1], self.frame_stride)
        t = len(chosen)
        flat = frames[:, chosen].flatten(0, 1)  # [N * t, 3, H, W], sample-major
        result = self.scorer.score(
            flat, [p for p in prompts for _ in range(t)], [m for m in metadata for _ in range(t)]
        )
        result.check(self.scorer.names, n * t, f"PerFrame({type(self.scorer).__name__})")
        scores: dict[str, Tensor] = {}
        errors: dict[str, list[str | None]] = {}
        for name in self.scorer.names:
            per = result.scores[name].to("cpu", torch.float32).view(n, t)
            frame_errors = result.errors.get(name) or [None] * (n * t)
            bad = ~torch.isfinite(per)
            value = per.mean(dim=1) if self.aggregate == "mean" else per.min(dim=1).values
            scores[name] = torch.where(bad.any(dim=1), torch.full_like(value, math.nan), value)
            errors[name] = []
            for i in range(n):
                if not bool(bad[i].any()):
                    errors[name].append(None)
                    continue
                j = int(bad[i].nonzero()[0])
                reason = frame_errors[i * t + j] or "non-finite score"
                errors[name].append(f"frame {chosen[j]}: {reason}")
        return ScoreResult(scores=scores, errors=errors, metrics=dict(result.metrics))

    def to(self, device: torch.device | str) -> PerFrame:
        self.scorer.to(device)
        self._device = torch.device(device)
        return self

    def offload(self) -> None:
        self.scorer.offload()

    def onload(self) -> None:
        self.scorer.onload()


@dataclass(kw_only=True)
class TemporalConsistency(RewardBackend):
    """``1 - mean_t mean |frame_{t+1} - frame_t|`` per video (over channels and pixels): 1 is a
    still video, flicker and jumps pull it down. Meant as a guard (logged, not rewarded), or a
    small-weight component against flicker. A one-frame video scores 1."""

    name: str = "temporal_consistency"

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        raise RewardError("TemporalConsistency scores videos, but the track decoded images")

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(prompts)
        frames = check_videos(frames, n, "TemporalConsistency").float()
        if frames.shape[1] < 2:
            return ScoreResult(scores={self.name: torch.ones(n)})
        change = (frames[:, 1:] - frames[:, :-1]).abs().mean(dim=(1, 2, 3, 4))
        return ScoreResult(scores={self.name: as_scores(1.0 - change)})


@dataclass(kw_only=True)
class VideoPickScore(PickScore):
    """PickScore of a video: the CLIP image embeddings of frames ``0, frame_stride, …, T-1``
    are averaged and re-normalised (mean pooling over time), then
    ``exp(logit_scale) · cos(pooled, E_txt(prompt))``. On images it is PickScore.
    ``frame_stride``: embed every this many frames (the last frame always included)."""

    name: str = "video_pickscore"
    frame_stride: PositiveInt = 1

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(prompts)
        frames = check_video_call(frames, prompts, metadata, type(self).__name__)
        chosen = frame_indices(frames.shape[1], self.frame_stride)
        self._ensure_ready()
        assert self._bundle is not None
        with torch.no_grad():
            flat = frames[:, chosen].flatten(0, 1).to(self.torch_device)
            embeds = clip_image_embeds(self._bundle, flat).view(n, len(chosen), -1)
            pooled = F.normalize(embeds.mean(dim=1), dim=-1)
            text = clip_text_embeds(self._bundle, prompts)
            values = self._scale((pooled * text).sum(dim=-1))
        return ScoreResult(scores={self.name: as_scores(values.float().cpu())})
