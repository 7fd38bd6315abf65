"""SDE-step schedules: which denoising steps of a rollout are stochastic (and trained).

``select(T, seed=..., rollout_index=...)`` returns sorted, unique step indices in ``[0, T)``;
step ``i`` goes ``sigmas[i] → sigmas[i + 1]``. The result depends only on the arguments, so a
group whose samples receive the same ``seed`` shares one choice. Steps not selected run with
the deterministic ``ODE`` kernel.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from unirl.config import require

# Guards int(x·T) against float noise such as 0.29 * 100 = 28.999999999999996.
_FRACTION_EPS = 1e-9


def _check_call(num_inference_steps: int, seed: int, rollout_index: int) -> None:
    if num_inference_steps < 1:
        raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    if seed < 0 or rollout_index < 0:
        raise ValueError(
            f"seed ({seed}) and rollout_index ({rollout_index}) must be >= 0; "
            "mask a hashed seed with & 0xFFFFFFFF"
        )


def _rng(seed: int, rollout_index: int) -> np.random.Generator:
    """A generator that depends only on (seed, rollout_index), stable across platforms."""
    return np.random.default_rng(np.random.SeedSequence([seed, rollout_index]))


class SDEStepSchedule(ABC):
    """Chooses the stochastic / trained steps of one rollout."""

    @abstractmethod
    def select(
        self, num_inference_steps: int, *, seed: int, rollout_index: int = 0
    ) -> tuple[int, ...]:
        """Sorted, unique step indices in ``[0, num_inference_steps)``."""


@dataclass(kw_only=True)
class AllSteps(SDEStepSchedule):
    """Every step; with ``exclude_last`` (default) all but the final step σ_{T−1} → 0.

    The final step lands on the clean sample: CPS has std 0 there and Flow-GRPO does not train
    it (its recipe trains the first T − 1 steps), so it runs as ODE by default.
    """

    exclude_last: bool = True

    def select(
        self, num_inference_steps: int, *, seed: int, rollout_index: int = 0
    ) -> tuple[int, ...]:
        _check_call(num_inference_steps, seed, rollout_index)
        end = num_inference_steps - 1 if self.exclude_last else num_inference_steps
        if end < 1:
            raise ValueError(
                f"AllSteps(exclude_last=True) needs num_inference_steps >= 2, got {num_inference_steps}"
            )
        return tuple(range(end))


@dataclass(kw_only=True)
class RandomSubsetSchedule(SDEStepSchedule):
    """``num_steps`` distinct steps drawn uniformly among indices in
    ``[floor(lo·T), floor(hi·T))`` for ``fraction=(lo, hi)``.

    The upper bound is ``int(hi·T)`` as in Flow-GRPO's ``timestep_fraction``: with T = 10,
    ``fraction=(0, 0.99)`` gives candidates 0..8, so ``num_steps=9`` is the canonical recipe.
    """

    num_steps: int
    fraction: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self) -> None:
        require(
            self.num_steps >= 1,
            f"RandomSubsetSchedule.num_steps must be >= 1, got {self.num_steps}",
        )
        frac: Sequence[float] = self.fraction  # a recipe's list or a pair
        require(
            len(frac) == 2,
            f"RandomSubsetSchedule.fraction must be a pair (lo, hi), got {frac!r}",
        )
        self.fraction = (float(frac[0]), float(frac[1]))
        lo, hi = self.fraction
        require(
            0.0 <= lo < hi <= 1.0,
            f"RandomSubsetSchedule.fraction must satisfy 0 <= lo < hi <= 1, got {self.fraction}",
        )

    def candidates(self, num_inference_steps: int) -> range:
        """The step indices this schedule draws from for ``T = num_inference_steps``."""
        lo, hi = self.fraction
        start = math.floor(lo * num_inference_steps + _FRACTION_EPS)
        end = math.floor(hi * num_inference_steps + _FRACTION_EPS)
        return range(start, min(end, num_inference_steps))

    def select(
        self, num_inference_steps: int, *, seed: int, rollout_index: int = 0
    ) -> tuple[int, ...]:
        _check_call(num_inference_steps, seed, rollout_index)
        pool = self.candidates(num_inference_steps)
        if len(pool) < self.num_steps:
            raise ValueError(
                f"RandomSubsetSchedule(num_steps={self.num_steps}, fraction={self.fraction}) has "
                f"only {len(pool)} candidate steps ({pool.start}..{pool.stop - 1}) for "
                f"num_inference_steps={num_inference_steps}; lower num_steps or widen fraction"
            )
        picked = _rng(seed, rollout_index).choice(len(pool), size=self.num_steps, replace=False)
        return tuple(sorted(pool.start + int(i) for i in picked))


@dataclass(kw_only=True)
class WindowSchedule(SDEStepSchedule):
    """A contiguous window of ``size`` steps ``[w, w + size)``.

    - fixed (default): w = ``start``.
    - ``progressive=True`` (MixGRPO): w = ``start + stride · (rollout_index // shift_interval)``,
      held at ``max_start`` once it gets there.
    - ``random=True`` (Flow-GRPO-Fast): w uniform in ``[start, max_start]``, seeded by
      (seed, rollout_index). Fast's "3-step window in the first half" of T = 10 is
      ``size=3, random=True, max_start=2``.

    ``stride``: steps the progressive window moves per shift; ``shift_interval``: rollouts
    between shifts (both read only with ``progressive=True``).
    ``max_start`` defaults to the last start that keeps the window inside the usable steps
    (``T − 1`` usable with ``exclude_last``, else ``T``).
    """

    size: int
    start: int = 0
    stride: int = 0
    shift_interval: int = 1
    max_start: int | None = None
    progressive: bool = False
    random: bool = False
    exclude_last: bool = True

    def __post_init__(self) -> None:
        require(self.size >= 1, f"WindowSchedule.size must be >= 1, got {self.size}")
        require(self.start >= 0, f"WindowSchedule.start must be >= 0, got {self.start}")
        require(self.stride >= 0, f"WindowSchedule.stride must be >= 0, got {self.stride}")
        require(
            self.shift_interval >= 1,
            f"WindowSchedule.shift_interval must be >= 1, got {self.shift_interval}",
        )
        require(
            not (self.progressive and self.random),
            "WindowSchedule: choose progressive=True or random=True, not both",
        )
        require(
            not self.progressive or self.stride > 0,
            "WindowSchedule(progressive=True) needs stride >= 1 (steps moved per shift_interval)",
        )
        if self.max_start is not None:
            require(
                self.max_start >= self.start,
                f"WindowSchedule.max_start ({self.max_start}) must be >= start ({self.start})",
            )

    def select(
        self, num_inference_steps: int, *, seed: int, rollout_index: int = 0
    ) -> tuple[int, ...]:
        _check_call(num_inference_steps, seed, rollout_index)
        usable = num_inference_steps - 1 if self.exclude_last else num_inference_steps
        last_start = usable - self.size if self.max_start is None else self.max_start
        if last_start < self.start or last_start + self.size > usable:
            raise ValueError(
                f"WindowSchedule(size={self.size}, start={self.start}, max_start={self.max_start}) "
                f"does not fit in {usable} usable steps (num_inference_steps={num_inference_steps}, "
                f"exclude_last={self.exclude_last}); lower size/start/max_start"
            )
        if self.random:
            w = int(_rng(seed, rollout_index).integers(self.start, last_start + 1))
        elif self.progressive:
            w = min(self.start + self.stride * (rollout_index // self.shift_interval), last_start)
        else:
            w = self.start
        return tuple(range(w, w + self.size))
