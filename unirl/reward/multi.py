"""Weighted combination of several reward backends into one total reward."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import RewardBackend, ScoreResult, as_backend

Normalize = Literal["none", "batch_zscore"]


@dataclass(kw_only=True)
class WeightedRewardBackend(RewardBackend):
    """``total[N] = Σ_c weights[c] · norm(score_c[N])`` over named components.

    ``components`` maps a key to a backend. A backend with one component is exposed under
    its key; one with several (e.g. ``ImageStats``) as ``"<key>/<component>"``. ``weights``
    must name every exposed component (``0.0`` logs a component without rewarding it).
    ``normalize="batch_zscore"`` standardises each component over the batch,
    ``(s - mean) / (std + eps)`` with population std over finite samples (``eps`` keeps a
    constant component finite), before weighting;
    ``component_rewards`` keep the raw scores. A NaN in a component with a non-zero weight
    makes the total NaN; zero-weight components never enter the total.
    """

    components: Mapping[str, RewardBackend]
    weights: Mapping[str, float]
    normalize: Normalize = "none"
    eps: float = 1.0e-6

    produces_total: ClassVar[bool] = True
    _routes: list[tuple[str, str, str]] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        self.components = {
            str(k): as_backend(v, f"WeightedRewardBackend.components[{k!r}]")
            for k, v in dict(self.components).items()
        }
        self.weights = {str(k): float(v) for k, v in dict(self.weights).items()}
        require(
            len(self.components) > 0, "WeightedRewardBackend.components: give at least one backend"
        )
        require(
            self.normalize in ("none", "batch_zscore"),
            f"WeightedRewardBackend.normalize={self.normalize!r}: use 'none' or 'batch_zscore'",
        )
        kinds = {type(b).__name__ for b in self.components.values()}
        for key, backend in self.components.items():
            require(
                not backend.produces_total,
                f"WeightedRewardBackend.components[{key!r}] is itself a combining backend; "
                "flatten its components into this one",
            )
            inner = backend.names
            for name in inner:
                route = key if len(inner) == 1 else f"{key}/{name}"
                self._routes.append((route, key, name))
        exposed = [r[0] for r in self._routes]
        missing = [n for n in exposed if n not in self.weights]
        unknown = [n for n in self.weights if n not in exposed]
        require(
            not missing,
            f"WeightedRewardBackend.weights has no entry for {missing}; give every component a "
            "weight (0.0 logs it without rewarding it)",
        )
        require(
            not unknown,
            f"WeightedRewardBackend.weights names unknown components {unknown}; "
            f"components are {exposed} (backends: {sorted(kinds)})",
        )
        for name, weight in self.weights.items():
            require(
                math.isfinite(weight), f"WeightedRewardBackend.weights[{name!r}] must be finite"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r[0] for r in self._routes)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        return self._combine(lambda b: b.score(images, prompts, metadata), len(prompts))

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        return self._combine(
            lambda b: b.score_edit(images, sources, prompts, metadata), len(prompts)
        )

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        return self._combine(lambda b: b.score_video(frames, fps, prompts, metadata), len(prompts))

    def score_texts(
        self, texts: list[str], prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        return self._combine(lambda b: b.score_texts(texts, prompts, metadata), len(prompts))

    def _combine(self, call: Callable[[RewardBackend], ScoreResult], n: int) -> ScoreResult:
        scores: dict[str, Tensor] = {}
        errors: dict[str, list[str | None]] = {}
        metrics: dict[str, float] = {}
        results: dict[str, ScoreResult] = {}
        for key, backend in self.components.items():
            result = call(backend)
            result.check(backend.names, n, f"reward component '{key}' ({type(backend).__name__})")
            results[key] = result
            metrics.update(result.metrics)
        total = torch.zeros(n, dtype=torch.float32)
        for exposed, key, name in self._routes:
            raw = results[key].scores[name].to(device="cpu", dtype=torch.float32)
            scores[exposed] = raw
            if name in results[key].errors:
                errors[exposed] = list(results[key].errors[name])
            weight = self.weights[exposed]
            if weight == 0.0:
                # A logged-only component must not turn the total into NaN.
                continue
            normed = batch_zscore(raw, self.eps) if self.normalize == "batch_zscore" else raw
            total = total + weight * normed
        return ScoreResult(scores=scores, errors=errors, total=total, metrics=metrics)

    def to(self, device: torch.device | str) -> WeightedRewardBackend:
        super().to(device)
        for backend in self.components.values():
            backend.to(device)
        return self

    def offload(self) -> None:
        for backend in self.components.values():
            backend.offload()

    def onload(self) -> None:
        for backend in self.components.values():
            backend.onload()


def batch_zscore(values: Tensor, eps: float) -> Tensor:
    """``(v - mean) / (std + eps)`` over the finite entries of ``values[N]`` (population std).

    Non-finite entries stay non-finite. With no finite entries, returns ``values`` unchanged.
    """
    finite = torch.isfinite(values)
    if not bool(finite.any()):
        return values
    kept = values[finite]
    mean = kept.mean()
    std = kept.std(correction=0)
    return (values - mean) / (std + eps)
