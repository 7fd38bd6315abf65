"""RewardService: score a rollout track, attach rewards, enforce the failure policy, log stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, cast

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import RewardBackend, RewardError, ScoreResult, as_backend
from unirl.reward.overlap import OverlappedScorer
from unirl.types import STATUS_DROPPED, STATUS_OK

if TYPE_CHECKING:
    from unirl.types import RolloutTrack

# a rollout track, or a subclass: scoring returns a copy of the same type
_Track = TypeVar("_Track", bound="RolloutTrack")


class _Frames(Protocol):
    """Decoded videos as :func:`_call` reads them (``unirl.types.Videos``)."""

    frames: Tensor
    fps: float


FailurePolicy = Literal["raise", "drop_group"]

_MAX_LISTED_FAILURES = 5


@dataclass(frozen=True)
class _Failure:
    component: str
    index: int
    value: float
    error: str | None


@dataclass(kw_only=True)
class RewardService:
    """Holds one backend (plus optional guards) and attaches rewards to a track.

    ``failure_policy="raise"`` (default): any missing or non-finite reward raises
    :class:`RewardError` naming the component, sample index and prompt.
    ``failure_policy="drop_group"``: every sample of a group containing a failed sample gets
    ``status = 1`` (dropped); non-finite values in those groups are replaced by ``0.0`` so no
    NaN leaks into later reductions; ``reward/dropped_groups`` counts them. Consumers must mask
    by ``track.status``.
    ``backend``: the reward backend block (one component, or a backend that combines several
    into a total, such as ``WeightedRewardBackend``).
    ``guards`` are anti-hacking statistics (e.g. ``ImageStats``): logged as
    ``guard/<name>/mean``, never part of the reward.
    """

    backend: RewardBackend
    failure_policy: FailurePolicy = "raise"
    guards: Sequence[RewardBackend] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.backend = as_backend(self.backend, "RewardService.backend")
        require(
            self.failure_policy in ("raise", "drop_group"),
            f"RewardService.failure_policy={self.failure_policy!r}: use 'raise' or 'drop_group'",
        )
        require(
            self.backend.produces_total or len(self.backend.names) == 1,
            f"RewardService.backend {type(self.backend).__name__} produces components "
            f"{list(self.backend.names)}; wrap it in unirl.reward.WeightedRewardBackend with "
            "weights to say how they form the reward",
        )
        self.guards = [
            as_backend(g, f"RewardService.guards[{i}]") for i, g in enumerate(self.guards)
        ]
        seen: set[str] = set()
        for guard in self.guards:
            for name in guard.names:
                require(
                    name not in seen,
                    f"RewardService.guards: component '{name}' appears twice",
                )
                seen.add(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Reward component names attached as ``component_rewards``."""
        return self.backend.names

    def score(self, decoded: object, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        """Score ``decoded`` (``Images`` with ``.pixels`` or ``Texts`` with ``.texts``)."""
        return _call(self.backend, decoded, prompts, metadata)

    def score_track(self, track: _Track) -> tuple[_Track, dict[str, float]]:
        """Returns ``(track with rewards[N], component_rewards, status), metrics``.

        Reads ``track.decoded``, ``track.prompts``, ``track.metadata``, ``track.group_ids``
        and ``track.status``; the returned track is a ``dataclasses.replace`` copy.
        """
        if track.prompts is None:
            raise RewardError("track.prompts is None; the engine must carry prompts to score")
        prompts = list(track.prompts)
        n = len(prompts)
        metadata = list(track.metadata) if track.metadata is not None else [{} for _ in prompts]
        if len(metadata) != n:
            raise RewardError(f"track has {n} prompts but {len(metadata)} metadata entries")
        references = getattr(track, "references", None)
        result = _call(self.backend, track.decoded, prompts, metadata, references)
        return self.assemble(track, result)

    def assemble(self, track: _Track, result: ScoreResult) -> tuple[_Track, dict[str, float]]:
        """The second half of :meth:`score_track`: check the backend's ``result`` for the
        whole track, apply the failure policy, compute metrics and guards (also used by
        :class:`unirl.reward.overlap.OverlappedScorer`, which scores chunks earlier)."""
        if track.prompts is None:
            raise RewardError("track.prompts is None; the engine must carry prompts to score")
        prompts = list(track.prompts)
        n = len(prompts)
        metadata = list(track.metadata) if track.metadata is not None else [{} for _ in prompts]
        references = getattr(track, "references", None)
        source = f"reward backend {type(self.backend).__name__}"
        result.check(self.backend.names, n, source)
        scores = {k: result.scores[k].to(device="cpu", dtype=torch.float32) for k in self.names}
        if result.total is not None:
            total = result.total.to(device="cpu", dtype=torch.float32)
        else:
            total = scores[self.names[0]].clone()

        status = _initial_status(getattr(track, "status", None), n)
        failures = _find_failures(scores, result.errors, total, status)
        metrics: dict[str, float] = dict(result.metrics)
        dropped_groups = 0
        if failures:
            if self.failure_policy == "raise":
                raise RewardError(_failure_message(failures, prompts))
            group_ids = getattr(track, "group_ids", None)
            if group_ids is None:
                raise RewardError(
                    "reward.failure_policy=drop_group needs track.group_ids; "
                    + _failure_message(failures, prompts)
                )
            group_ids = torch.as_tensor(group_ids).to("cpu").long()
            bad_groups = torch.unique(group_ids[[f.index for f in failures]])
            in_bad = torch.isin(group_ids, bad_groups)
            status[in_bad] = STATUS_DROPPED
            total = torch.where(in_bad & ~torch.isfinite(total), torch.zeros_like(total), total)
            for k, v in scores.items():
                scores[k] = torch.where(in_bad & ~torch.isfinite(v), torch.zeros_like(v), v)
            dropped_groups = int(bad_groups.numel())
            for f in failures:
                key = f"reward/failures/{f.component}"
                metrics[key] = metrics.get(key, 0.0) + 1.0
        metrics["reward/dropped_groups"] = float(dropped_groups)
        metrics["reward/dropped_samples"] = float((status != STATUS_OK).sum())

        ok = status == STATUS_OK
        metrics.update(_mean_std("reward", total[ok]))
        for k, v in scores.items():
            metrics.update(_mean_std(f"reward/{k}", v[ok]))
        metrics.update(self._guard_metrics(track.decoded, prompts, metadata, ok, references))

        scored = dataclasses.replace(track, rewards=total, component_rewards=scores, status=status)
        return scored, metrics

    def _guard_metrics(
        self,
        decoded: object,
        prompts: list[str],
        metadata: list[dict],
        ok: Tensor,
        references: object = None,
    ) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for guard in self.guards:
            result = _call(guard, decoded, prompts, metadata, references)
            result.check(guard.names, len(prompts), f"guard {type(guard).__name__}")
            metrics.update(result.metrics)
            for name in guard.names:
                values = result.scores[name].to(device="cpu", dtype=torch.float32)[ok]
                finite = torch.isfinite(values)
                metrics[f"guard/{name}/mean"] = (
                    float(values[finite].mean()) if bool(finite.any()) else float("nan")
                )
                metrics[f"guard/{name}/failures"] = float((~finite).sum())
        return metrics

    def overlapped(self) -> OverlappedScorer:
        """A scorer of this service that takes a rollout chunk by chunk on a background
        thread (:mod:`unirl.reward.overlap`)."""
        return OverlappedScorer(self)

    def to(self, device: torch.device | str) -> RewardService:
        """Move the backend and guards to ``device``."""
        self.backend.to(device)
        for guard in self.guards:
            guard.to(device)
        return self

    def offload(self) -> None:
        self.backend.offload()
        for guard in self.guards:
            guard.offload()

    def onload(self) -> None:
        self.backend.onload()
        for guard in self.guards:
            guard.onload()


def _call(
    backend: RewardBackend,
    decoded: object,
    prompts: list[str],
    metadata: list[dict],
    references: object = None,
) -> ScoreResult:
    pixels = getattr(decoded, "pixels", None)
    if pixels is not None:
        sources = getattr(references, "pixels", None)
        if sources is not None:  # an edit: the backend sees result and source
            return backend.score_edit(pixels, sources.to(pixels.device), prompts, metadata)
        return backend.score(pixels, prompts, metadata)
    frames = getattr(decoded, "frames", None)
    if frames is not None:
        return backend.score_video(frames, float(cast("_Frames", decoded).fps), prompts, metadata)
    texts = getattr(decoded, "texts", None)
    if texts is not None:
        return backend.score_texts(list(texts), prompts, metadata)
    if decoded is None:
        return backend.score(None, prompts, metadata)
    raise RewardError(
        f"cannot score track.decoded of type {type(decoded).__name__}; "
        "expected unirl.types.Images (.pixels), Videos (.frames) or Texts (.texts)"
    )


def _initial_status(status: Tensor | None, n: int) -> Tensor:
    if status is None:
        return torch.zeros(n, dtype=torch.long)
    status = torch.as_tensor(status).to("cpu").long().clone()
    if tuple(status.shape) != (n,):
        raise RewardError(f"track.status has shape {tuple(status.shape)}; expected ({n},)")
    return status


def _find_failures(
    scores: dict[str, Tensor],
    errors: dict[str, list[str | None]],
    total: Tensor,
    status: Tensor,
) -> list[_Failure]:
    """Non-finite scores of samples not already dropped, per component, then the total."""
    live = status == STATUS_OK
    failures: list[_Failure] = []
    failed_samples: set[int] = set()
    for name, values in scores.items():
        bad = (~torch.isfinite(values) & live).nonzero().flatten().tolist()
        for i in bad:
            err = errors.get(name, [None] * len(values))[i]
            failures.append(_Failure(name, i, float(values[i]), err))
            failed_samples.add(i)
    for i in (~torch.isfinite(total) & live).nonzero().flatten().tolist():
        if i not in failed_samples:
            failures.append(_Failure("total", i, float(total[i]), None))
    return failures


def _failure_message(failures: list[_Failure], prompts: list[str]) -> str:
    first = failures[0]
    prompt = prompts[first.index]
    if len(prompt) > 80:
        prompt = prompt[:77] + "..."
    msg = (
        f"reward component '{first.component}' is {first.value} for sample {first.index} "
        f"of {len(prompts)} (prompt {prompt!r})"
    )
    if first.error:
        msg += f": {first.error}"
    if len(failures) > 1:
        more = ", ".join(
            f"'{f.component}' sample {f.index}" for f in failures[1 : 1 + _MAX_LISTED_FAILURES]
        )
        extra = len(failures) - 1 - _MAX_LISTED_FAILURES
        msg += f"; also {more}" + (f" and {extra} more" if extra > 0 else "")
    msg += ". Fix the scorer, or set reward.failure_policy=drop_group to drop affected groups."
    return msg


def _mean_std(prefix: str, values: Tensor) -> dict[str, float]:
    """``{prefix}/mean`` and ``{prefix}/std`` (population std); NaN when empty."""
    if values.numel() == 0:
        return {f"{prefix}/mean": float("nan"), f"{prefix}/std": float("nan")}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/std": float(values.std(correction=0)),
    }
