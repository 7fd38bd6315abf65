"""One worker pool per reward: replica threads, cross-request batching, timeouts.

Each replica is a thread that owns its own scorer instance, so a scorer is never called
from two threads at once. Requests are queued as jobs (at most ``max_batch_size`` images
or videos each); a free replica takes the oldest job, waits up to ``batch_wait_ms`` for more, takes
every following job that still fits in ``max_batch_size`` and scores them in one call per
image size.

Timeouts cancel the work. When a request times out while a replica is still scoring its
samples (or has been busy for longer than ``timeout_s``), the replica is retired: a
replacement with a fresh scorer starts at once, and :class:`ScoringCancelled` is raised
inside the retired thread (``PyThreadState_SetAsyncExc``), which stops the scorer at its
next Python bytecode: between two batches, two images, two torch calls. Jobs of other
requests that shared the cancelled call go back to the front of the queue; the thread exits.
The bound: a native call already running (one torch op, one OCR engine call, a
``time.sleep``) finishes first, since CPython delivers the exception when it returns to the
interpreter; the thread is counted as ``abandoned`` until it has exited, at most
``replicas`` at a time (past that, no replacement starts until one exits).
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import Tensor
from unirl.reward import RewardBackend

from unirl_reward_service.config import RewardConfig

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One sample to score: ``pixels`` ``uint8[3, H, W]`` RGB (an image) or
    ``uint8[T, 3, H, W]`` (a video, with its ``fps``), its prompt and metadata, and for an
    edit ``source`` (``uint8[3, H', W']``, the image it was edited from)."""

    pixels: Tensor
    prompt: str
    metadata: dict
    source: Tensor | None = None
    fps: float | None = None

    @property
    def is_video(self) -> bool:
        return self.pixels.ndim == 4


@dataclass
class SampleResult:
    """One sample's scores: every component (NaN = failed), errors of flagged components only,
    and the total for combining backends (``None`` otherwise)."""

    components: dict[str, float]
    errors: dict[str, str] = field(default_factory=dict)
    total: float | None = None

    @classmethod
    def failed(cls, names: tuple[str, ...], message: str, has_total: bool) -> SampleResult:
        return cls(
            components=dict.fromkeys(names, math.nan),
            errors=dict.fromkeys(names, message),
            total=math.nan if has_total else None,
        )


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def needs_sources(scorer: RewardBackend) -> bool:
    """Whether ``scorer`` compares each image with its source: an edit reward
    (``needs_references``), or a combination (``components``) holding one."""
    if getattr(scorer, "needs_references", False):
        return True
    components = getattr(scorer, "components", None)
    return isinstance(components, Mapping) and any(
        isinstance(c, RewardBackend) and needs_sources(c) for c in components.values()
    )


def scores_videos(scorer: RewardBackend) -> bool:
    """Whether ``scorer`` scores whole videos: it implements ``score_video`` (a video reward,
    ``PerFrame``) and, for a combination (``components``), so does every component."""
    if type(scorer).score_video is RewardBackend.score_video:
        return False
    components = getattr(scorer, "components", None)
    if isinstance(components, Mapping):
        return all(isinstance(c, RewardBackend) and scores_videos(c) for c in components.values())
    return True


def score_samples(
    scorer: RewardBackend, samples: list[Sample], has_total: bool, source: str
) -> list[SampleResult]:
    """Score ``samples`` with one call per image size (and source size; per video shape and
    fps); isolate failures per sample.

    Videos go to ``score_video``; a scorer without it (an image reward) fails them with one
    error each naming ``PerFrame``, no call. Samples with a source go to ``score_edit`` (which scorers of the result alone answer
    like ``score``); a scorer that needs sources fails the samples without one (one error
    each, no call). When a call with several samples raises, each of its samples is scored
    alone, so one bad sample (or one bad request batched with others) fails only itself.
    """
    names = tuple(scorer.names)
    groups: dict[tuple[tuple[int, ...], tuple[int, ...] | None, float | None], list[int]] = {}
    for i, sample in enumerate(samples):
        source_shape = None if sample.source is None else tuple(sample.source.shape)
        key = (tuple(sample.pixels.shape), source_shape, sample.fps)
        groups.setdefault(key, []).append(i)
    out: list[SampleResult | None] = [None] * len(samples)
    needs = needs_sources(scorer)
    videos = scores_videos(scorer)
    for (shape, source_shape, _), indices in groups.items():
        if len(shape) == 4 and not videos:
            message = (
                f"{source} scores images, not videos; on the server wrap it as "
                "{_target_: unirl.reward.local.PerFrame, aggregate: mean, scorer: {...}} to "
                "score each frame and aggregate over time, or use a video reward"
            )
            for i in indices:
                out[i] = SampleResult.failed(names, message, has_total)
            continue
        if needs and source_shape is None:
            message = (
                f"{source} compares each image with the image it was edited from; send "
                "'sources' (one base64 image per image) with the request"
            )
            for i in indices:
                out[i] = SampleResult.failed(names, message, has_total)
            continue
        try:
            results = _score_group(scorer, [samples[i] for i in indices], has_total, source)
        except Exception as exc:
            if len(indices) == 1:
                out[indices[0]] = SampleResult.failed(names, describe(exc), has_total)
                continue
            results = []
            for i in indices:
                try:
                    results += _score_group(scorer, [samples[i]], has_total, source)
                except Exception as single_exc:
                    results.append(SampleResult.failed(names, describe(single_exc), has_total))
        for i, result in zip(indices, results):
            out[i] = result
    return out  # type: ignore[return-value]


def _score_group(
    scorer: RewardBackend, group: list[Sample], has_total: bool, source: str
) -> list[SampleResult]:
    """One scorer call on same-sized images: ``images[n, 3, H, W]`` float32 in [0, 1]
    (``score_edit`` with the same-sized ``sources`` when the samples carry them), or on
    same-shaped videos at one fps: ``score_video(frames[n, T, 3, H, W], fps, ...)``."""
    n = len(group)
    images = torch.stack([s.pixels for s in group]).float().div_(255.0)
    prompts = [s.prompt for s in group]
    metadata = [dict(s.metadata) for s in group]  # scorers must not mutate shared request data
    with torch.no_grad():
        if group[0].is_video:
            fps = group[0].fps
            if fps is None:
                raise RuntimeError(f"{source}: a video sample without fps reached the pool")
            result = scorer.score_video(images, fps, prompts, metadata)
        elif group[0].source is not None:
            # one group holds one source size, so every sample of it carries a source
            sources = torch.stack([s.source for s in group if s.source is not None])
            sources = sources.float().div_(255.0)
            result = scorer.score_edit(images, sources, prompts, metadata)
        else:
            result = scorer.score(images, prompts, metadata)
    names = tuple(scorer.names)
    result.check(names, n, source)
    if has_total and result.total is None:
        raise RuntimeError(f"{source} is a combining backend but returned no total")
    scores = {k: result.scores[k].detach().float().cpu().tolist() for k in names}
    totals = result.total.detach().float().cpu().tolist() if has_total else None
    out = []
    for k in range(n):
        components = {name: float(scores[name][k]) for name in names}
        errors: dict[str, str] = {}
        for name in names:
            given = (result.errors.get(name) or [None] * n)[k]
            if given:
                errors[name] = str(given)
            elif not math.isfinite(components[name]):
                errors[name] = f"non-finite score ({components[name]})"
        out.append(
            SampleResult(components, errors, float(totals[k]) if totals is not None else None)
        )
    return out


class ScoringCancelled(BaseException):
    """Raised inside a replica thread to stop a scorer call that ran past a request's
    timeout. A ``BaseException`` (as ``KeyboardInterrupt``), so a scorer's ``except
    Exception`` does not swallow it."""


def interrupt(thread: threading.Thread) -> bool:
    """Raise :class:`ScoringCancelled` in ``thread`` at its next Python bytecode; whether
    the interpreter found the thread."""
    if thread.ident is None:
        return False
    found = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(ScoringCancelled)
    )
    return int(found) == 1


class _Job:
    __slots__ = ("expired", "future", "requeued", "samples")

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples
        self.future: Future[list[SampleResult]] = Future()
        self.expired = False  # its request gave up waiting
        self.requeued = False  # taken once, its call cancelled, queued again (future running)


class _Replica:
    def __init__(self, index: int, scorer: RewardBackend | None) -> None:
        self.index = index
        self.scorer = scorer
        self.started: float | None = None
        self.jobs: list[_Job] = []
        self.abandoned = False
        self.thread: threading.Thread | None = None
        # ``in_call`` (under ``guard``): the thread is inside the scorer call, the only place
        # where it may be interrupted
        self.guard = threading.Lock()
        self.in_call = False
        self.interrupted = False
        self.left = False  # counted out of the pool's abandoned threads


class RewardPool:
    """Worker threads for one reward. ``submit`` returns futures of per-sample results."""

    def __init__(self, config: RewardConfig, batch_wait_s: float) -> None:
        self.config = config
        self.batch_wait_s = batch_wait_s
        scorers = [config.build() for _ in range(config.replicas)]
        self.names: tuple[str, ...] = tuple(scorers[0].names)
        self.has_total = bool(scorers[0].produces_total)
        self.needs_sources = needs_sources(scorers[0])
        self.scores_videos = scores_videos(scorers[0])
        self.source = f"reward '{config.name}' ({config.target})"
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._replicas: list[_Replica] = []
        self._next_index = 0
        self._abandoned = 0
        self._closed = False
        self.counters = dict.fromkeys(
            ("scored_samples", "failed_samples", "timeouts", "batches"), 0
        )
        with self._cond:
            for scorer in scorers:
                self._spawn(scorer)

    def submit(self, samples: list[Sample]) -> list[Future[list[SampleResult]]]:
        """Queue ``samples`` in chunks of at most ``max_batch_size``; one future per chunk."""
        size = self.config.max_batch_size
        jobs = [_Job(samples[i : i + size]) for i in range(0, len(samples), size)]
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.source}: the pool is shut down")
            self._queue.extend(jobs)
            self._cond.notify_all()
        return [job.future for job in jobs]

    def expire(self, futures: list[Future[list[SampleResult]]], timed_out_samples: int) -> None:
        """A request gave up on ``futures``: drop queued ones; retire replicas still running
        them or busy past ``timeout_s``: cancel their call and start a replacement (at most
        ``replicas`` retired threads not yet exited at a time)."""
        with self._cond:
            for future in futures:
                future.cancel()  # only succeeds while still queued
            self.counters["timeouts"] += timed_out_samples
            now = time.monotonic()
            expired = {id(f) for f in futures}
            for job in self._queue:  # a requeued job of this request: nobody waits for it
                job.expired = job.expired or id(job.future) in expired
            for replica in list(self._replicas):
                if replica.started is None:
                    continue
                for job in replica.jobs:
                    job.expired = job.expired or id(job.future) in expired
                # Stuck: running a job this request gave up on, or busy past timeout_s.
                runs_expired = any(job.expired for job in replica.jobs)
                overdue = now - replica.started >= self.config.timeout_s
                if (runs_expired or overdue) and self._abandoned < self.config.replicas:
                    log.warning(
                        "%s: replica %d busy for %.2fs past a request's timeout %.1fs; "
                        "cancelling its call and starting a replacement",
                        self.source,
                        replica.index,
                        now - replica.started,
                        self.config.timeout_s,
                    )
                    replica.abandoned = True
                    self._abandoned += 1
                    self._replicas.remove(replica)
                    self._spawn(None)
                    with replica.guard:
                        if replica.in_call and replica.thread is not None:
                            replica.interrupted = interrupt(replica.thread)

    def state(self) -> dict[str, int]:
        with self._cond:
            return {
                "replicas": sum(r.scorer is not None for r in self._replicas),
                "busy": sum(r.started is not None for r in self._replicas),
                "abandoned": self._abandoned,
                "queued_jobs": len(self._queue),
                "queued_samples": sum(len(j.samples) for j in self._queue),
                **self.counters,
            }

    def close(self, join_timeout_s: float = 5.0) -> None:
        """Stop taking work, cancel queued jobs and join idle replicas."""
        with self._cond:
            self._closed = True
            for job in self._queue:
                if not job.future.cancel() and not job.future.done():  # a requeued job
                    job.future.set_exception(RuntimeError(f"{self.source}: the pool is shut down"))
            self._queue.clear()
            threads = [r.thread for r in self._replicas if r.thread is not None]
            self._cond.notify_all()
        deadline = time.monotonic() + join_timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- worker side -----------------------------------------------------------------------

    def _spawn(self, scorer: RewardBackend | None) -> None:
        """Start a replica thread (caller holds the lock); ``None`` builds its own scorer."""
        replica = _Replica(self._next_index, scorer)
        self._next_index += 1
        replica.thread = threading.Thread(
            target=self._work,
            args=(replica,),
            name=f"reward-{self.config.name}-{replica.index}",
            daemon=True,
        )
        self._replicas.append(replica)
        replica.thread.start()

    def _work(self, replica: _Replica) -> None:
        try:
            self._serve(replica)
        except ScoringCancelled:  # from expire(): the call ran past a request's timeout
            self._cancelled(replica)

    def _cancelled(self, replica: _Replica) -> None:
        """The retired thread's last act: finish its expired jobs, queue the others again
        (at the front, in order) for the replicas that remain, and leave the pool."""
        with self._cond:
            for job in reversed(replica.jobs):
                if job.future.done():
                    continue
                if job.expired:
                    job.future.set_exception(
                        TimeoutError(f"{self.source}: cancelled after timeout_s")
                    )
                else:
                    job.requeued = True
                    self._queue.appendleft(job)
            replica.jobs = []
            replica.started = None
            self._leave(replica)
            self._cond.notify_all()
        log.warning("%s: replica %d cancelled and exited", self.source, replica.index)

    def _serve(self, replica: _Replica) -> None:
        if replica.scorer is None:
            try:
                replica.scorer = self.config.build()
            except Exception:
                log.exception("%s: building a replacement replica failed", self.source)
                with self._cond:
                    if replica in self._replicas:
                        self._replicas.remove(replica)
                return
        while True:
            jobs = self._take(replica)
            if jobs is None:
                return
            self._run(replica, jobs)
            with self._cond:
                replica.started = None
                replica.jobs = []
                if replica.abandoned:
                    self._leave(replica)
                    return

    def _leave(self, replica: _Replica) -> None:
        """An abandoned replica's thread is exiting (caller holds the lock; counted once)."""
        if replica.abandoned and not replica.left:
            replica.left = True
            self._abandoned -= 1

    def _take(self, replica: _Replica) -> list[_Job] | None:
        """Block for the next batch of jobs; ``None`` when the pool closes."""
        limit = self.config.max_batch_size
        with self._cond:
            while True:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                jobs: list[_Job] = []
                count = 0
                deadline = time.monotonic() + self.batch_wait_s
                while True:
                    while self._queue and count + len(self._queue[0].samples) <= limit:
                        job = self._queue.popleft()
                        if job.requeued:  # its future is running already
                            if job.future.done():
                                continue
                            if job.expired:  # its request gave up while it waited again
                                job.future.set_exception(
                                    TimeoutError(f"{self.source}: cancelled after timeout_s")
                                )
                                continue
                            jobs.append(job)
                            count += len(job.samples)
                            continue
                        if job.future.set_running_or_notify_cancel():  # False: timed out
                            jobs.append(job)
                            count += len(job.samples)
                    remaining = deadline - time.monotonic()
                    if count >= limit or self._queue or remaining <= 0 or self._closed:
                        break
                    self._cond.wait(remaining)
                if jobs:
                    replica.started = time.monotonic()
                    replica.jobs = jobs
                    return jobs

    def _run(self, replica: _Replica, jobs: list[_Job]) -> None:
        samples = [s for job in jobs for s in job.samples]
        assert replica.scorer is not None
        try:
            with replica.guard:
                replica.in_call = True
            try:
                results = score_samples(replica.scorer, samples, self.has_total, self.source)
            finally:
                with replica.guard:
                    replica.in_call = False
        except ScoringCancelled:
            raise
        except BaseException as exc:  # a bug outside the scorer call: fail these jobs only
            log.exception("%s: scoring a batch failed", self.source)
            for job in jobs:
                job.future.set_exception(exc)
            return
        failed = sum(
            any(not math.isfinite(v) for v in r.components.values())
            or (r.total is not None and not math.isfinite(r.total))
            for r in results
        )
        with self._cond:
            self.counters["batches"] += 1
            self.counters["scored_samples"] += len(samples)
            self.counters["failed_samples"] += failed
        offset = 0
        for job in jobs:
            job.future.set_result(results[offset : offset + len(job.samples)])
            offset += len(job.samples)
