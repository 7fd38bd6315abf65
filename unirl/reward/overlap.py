"""Reward time hidden under sampling: score a track chunk by chunk on a background thread as
each chunk is decoded, then attach the rewards for the whole track exactly as
:meth:`RewardService.score_track` would.

The caller (an engine's sampling loop) calls :meth:`OverlappedScorer.submit` with each decoded
chunk (a :class:`RolloutTrack` slice carrying ``decoded``, ``prompts``, ``metadata``) and
goes on sampling the next one; one worker thread scores the chunks in order. :meth:`finish`
waits for the last chunk, concatenates the per-chunk :class:`ScoreResult` s and hands them to
:meth:`RewardService.assemble`: the failure policy, totals, metrics and guards then run on the
whole track, so rewards, component rewards and status equal end-of-rollout scoring bit for bit
whenever the backend scores each sample independently of its batch-mates (rule scorers: GenEval,
OCR, JPEG, targets). A batch-normalised total (``WeightedRewardBackend(normalize=batch_zscore)``)
is refused; model scorers change only at fp rounding with the batch shape (submit chunks of
their ``batch_size`` to keep it exact).

On a CUDA device the chunks are scored on a stream of their own, which waits for the event
the sampling stream recorded when the chunk was submitted: the scorer's kernels can then run
beside the next chunk's denoise loop instead of queueing behind it on one stream, and the
thread synchronises its stream before it hands a result back.

Metrics (``reward_overlap/``): ``latency_s`` (thread time spent scoring), ``wait_s`` (time
:meth:`finish` blocked), ``hidden_fraction`` (``1 - wait_s / latency_s``, clamped to [0, 1]: the
share of reward time that ran under sampling), ``queue_depth_max`` (chunks waiting or running
when one was submitted, the one submitted included), ``chunks``. Backend metrics of the chunks
(e.g. ``geneval/<task>``) are combined as sample-weighted means.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from unirl.config import require
from unirl.reward.base import ScoreResult

if TYPE_CHECKING:
    from unirl.types import RolloutTrack

_Track = TypeVar("_Track", bound="RolloutTrack")


class _Service(Protocol):
    """What the scorer calls of :class:`~unirl.reward.RewardService` (which imports this
    module, so it is named by its shape here)."""

    @property
    def backend(self) -> object: ...

    def score(self, decoded: object, prompts: list[str], metadata: list[dict]) -> ScoreResult: ...

    def assemble(self, track: _Track, result: ScoreResult) -> tuple[_Track, dict[str, float]]: ...


@dataclass
class _Chunk:
    size: int
    future: Future


def media_device(decoded: object) -> torch.device | None:
    """The device of a chunk's decoded pixels or frames (``None`` when it holds neither)."""
    tensor = getattr(decoded, "pixels", None)
    if tensor is None:
        tensor = getattr(decoded, "frames", None)
    return tensor.device if isinstance(tensor, torch.Tensor) else None


def merge_results(parts: list[tuple[int, ScoreResult]]) -> ScoreResult:
    """One :class:`ScoreResult` for the concatenated samples of ``(size, result)`` parts:
    scores, errors and totals concatenated; metrics averaged weighted by size."""
    require(bool(parts), "merge_results: no chunks were scored")
    names = list(parts[0][1].scores)
    scores = {k: torch.cat([r.scores[k].to("cpu", torch.float32) for _, r in parts]) for k in names}
    errors: dict[str, list[str | None]] = {}
    for k in {k for _, r in parts for k in r.errors}:
        errors[k] = [e for n, r in parts for e in r.errors.get(k, [None] * n)]
    totals = [r.total for _, r in parts]
    total = None
    if any(t is not None for t in totals):
        require(all(t is not None for t in totals), "merge_results: a chunk lacks its total")
        total = torch.cat([t.to("cpu", torch.float32) for t in totals if t is not None])
    metrics: dict[str, float] = {}
    for key in {k for _, r in parts for k in r.metrics}:
        have = [(n, r.metrics[key]) for n, r in parts if key in r.metrics]
        metrics[key] = sum(n * v for n, v in have) / max(sum(n for n, _ in have), 1)
    return ScoreResult(scores=scores, errors=errors, total=total, metrics=metrics)


class OverlappedScorer:
    """Scores submitted chunks on one background thread; :meth:`finish` attaches the rewards.

    ``service``: the :class:`~unirl.reward.RewardService` whose backend scores
    (``service.score``) and whose policy applies (``service.assemble``); built by
    ``RewardService.overlapped()``. One scorer serves one rollout at a time: :meth:`finish`
    resets it for the next. Edits (chunks with reference images) are not overlapped.
    """

    def __init__(self, service: _Service) -> None:
        normalize = getattr(service.backend, "normalize", "none")
        require(
            normalize == "none",
            f"reward overlap: the backend normalises its total over the batch "
            f"(normalize={normalize!r}), so a chunk's scores depend on the other chunks; set "
            "normalize: none or score at the end of the rollout",
        )
        self.service = service
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unirl-reward")
        self._chunks: list[_Chunk] = []
        self._latency = 0.0
        self._depth_max = 0
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def _score(self, chunk: RolloutTrack, ready: torch.cuda.Event | None) -> ScoreResult:
        assert chunk.prompts is not None  # submit refuses a chunk without prompts
        t0 = time.perf_counter()
        device = media_device(chunk.decoded)
        stream = self._streams.get(device) if device is not None else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if stream is not None and ready is not None:
                stream.wait_event(ready)  # the pixels are written on the sampling stream
            result = self.service.score(
                chunk.decoded,
                list(chunk.prompts),
                list(chunk.metadata) if chunk.metadata is not None else [{} for _ in chunk.prompts],
            )
            if stream is not None:
                stream.synchronize()  # the result is complete before the caller reads it
        self._latency += time.perf_counter() - t0
        return result

    def _ready_event(self, decoded: object) -> torch.cuda.Event | None:
        """An event on the submitting thread's stream after the chunk's media were written,
        with a scoring stream for their device (CUDA only)."""
        device = media_device(decoded)
        if device is None or device.type != "cuda":
            return None
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def submit(self, chunk: RolloutTrack) -> None:
        """Queue ``chunk`` for scoring and return at once."""
        require(chunk.prompts is not None, "reward overlap: a chunk carries no prompts")
        require(
            getattr(chunk, "references", None) is None,
            "reward overlap: edits (reference images) are scored at the end of the rollout; "
            "set rollout.reward_overlap=false",
        )
        assert chunk.prompts is not None  # the require above refuses None
        pending = sum(1 for c in self._chunks if not c.future.done())
        self._depth_max = max(self._depth_max, pending + 1)
        ready = self._ready_event(chunk.decoded)
        self._chunks.append(
            _Chunk(len(chunk.prompts), self._pool.submit(self._score, chunk, ready))
        )

    def finish(self, track: _Track) -> tuple[_Track, dict[str, float]]:
        """Wait for the chunks, then ``(scored track, metrics)`` as ``score_track(track)``;
        ``track`` holds the chunks' samples in submission order."""
        require(track.prompts is not None, "reward overlap: the track carries no prompts")
        assert track.prompts is not None  # the require above refuses None
        t0 = time.perf_counter()
        parts = [(c.size, c.future.result()) for c in self._chunks]
        wait = time.perf_counter() - t0
        require(
            sum(n for n, _ in parts) == len(track.prompts),
            f"reward overlap: {sum(n for n, _ in parts)} samples were submitted for a track of "
            f"{len(track.prompts)}",
        )
        scored, metrics = self.service.assemble(track, merge_results(parts))
        latency = self._latency
        metrics.update(
            {
                "reward_overlap/latency_s": latency,
                "reward_overlap/wait_s": wait,
                "reward_overlap/hidden_fraction": min(1.0, max(0.0, 1.0 - wait / latency))
                if latency > 0
                else 1.0,
                "reward_overlap/queue_depth_max": float(self._depth_max),
                "reward_overlap/chunks": float(len(parts)),
            }
        )
        self._chunks, self._latency, self._depth_max = [], 0.0, 0
        return scored, metrics

    def close(self) -> None:
        self._pool.shutdown(wait=True)
