"""Reference-policy control: the coefficient β of the KL-to-reference term, fixed or adaptive.

A recipe configures it once for every loss as the block ``algorithm.kl`` (a :class:`KLConfig`).
Every loss (FlowGRPO, FlowDPPO, DiffusionNFT, GRPO, DRPO) with ``kl.beta > 0`` adds
``β · mean KL`` to its loss and feeds each measured KL to :meth:`KLController.observe`. After the optimizer steps
of a rollout, :meth:`KLController.step` averages the rollout's KL over every value observed on
every data-parallel rank and, with ``control="adaptive"``, moves β:

    e = clip(KL / target − 1, −0.2, 0.2)
    β ← β · (1 + e / horizon)

the proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
Preferences", the ``AdaptiveKLController`` of PPO-for-LMs code) with ``n_steps = 1``: one
update per rollout, so ``horizon`` counts rollouts. Per update β moves by at most a factor
``1 ± 0.2 / horizon``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import torch
from torch import Tensor

from unirl.config.require import require
from unirl.config.typecheck import NonNegativeFloat, PositiveFloat

KL_CONTROLS = ("fixed", "adaptive")
ERROR_CLIP = 0.2  # |e| bound of the proportional controller


def adaptive_beta(beta: float, kl: float, target: float, horizon: float) -> float:
    """One controller update: ``β · (1 + clip(kl / target − 1, ±0.2) / horizon)``."""
    error = min(max(kl / target - 1.0, -ERROR_CLIP), ERROR_CLIP)
    return beta * (1.0 + error / horizon)


def _reduce_sum_count(
    total: float, count: int, device: torch.device | str | None
) -> tuple[float, int]:
    """Sum ``(total, count)`` over every rank when torch.distributed is initialised."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return total, count
    if device is None:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0]), round(float(t[1]))


@dataclass(kw_only=True)
class KLConfig:
    """The KL-to-reference knobs of every loss: the recipe block ``algorithm.kl``.

    ``beta``: the constant (``control="fixed"``) or initial (``"adaptive"``) β; 0 (the
    default, and what an absent block means) switches the KL term off: no reference forward
    at all. ``target``: the KL the adaptive controller steers toward, in the units of the
    loss's KL (per-sample mean over C·H·W of one step). ``horizon`` (rollouts, >= 1): how
    slowly β follows.
    """

    beta: NonNegativeFloat = 0.0
    control: Literal["fixed", "adaptive"] = "fixed"
    target: PositiveFloat | None = None
    horizon: PositiveFloat = 10.0

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.beta) and self.beta >= 0,
            f"algorithm.kl.beta must be >= 0, got {self.beta}",
        )
        require(
            self.control in KL_CONTROLS,
            f"algorithm.kl.control must be 'fixed' or 'adaptive', got {self.control!r}",
        )
        if self.control == "fixed":
            require(
                self.target is None,
                "algorithm.kl.target is used only by kl.control=adaptive; set "
                "algorithm.kl.control=adaptive or algorithm.kl.target=null",
            )
            return
        require(
            self.beta > 0,
            "algorithm.kl.control=adaptive scales β multiplicatively from kl.beta, so "
            "algorithm.kl.beta must be > 0 (the initial β)",
        )
        require(
            self.target is not None and math.isfinite(self.target) and self.target > 0,
            f"algorithm.kl.target must be a KL > 0 with kl.control=adaptive, got {self.target}",
        )
        require(
            math.isfinite(self.horizon) and self.horizon >= 1,
            f"algorithm.kl.horizon must be >= 1 rollout, got {self.horizon}",
        )

    @property
    def enabled(self) -> bool:
        """Whether the loss computes the KL term at all (``beta > 0``)."""
        return self.beta > 0


def as_kl_config(value: KLConfig | Mapping[str, Any] | None) -> KLConfig:
    """``algorithm.kl`` as a :class:`KLConfig`: the dataclass itself, a mapping of its fields
    (a Hydra block, with or without ``_target_``) or ``None`` (no KL term)."""
    if value is None:
        return KLConfig()
    if isinstance(value, KLConfig):
        return value
    require(
        isinstance(value, Mapping),
        f"algorithm.kl must be a KLConfig block or a mapping of its fields, got "
        f"{type(value).__name__}",
    )
    return KLConfig(**{str(k): v for k, v in value.items() if k != "_target_"})


class KLState(TypedDict):
    """:meth:`KLController.state_dict`: what a resume restores."""

    control: str
    beta: float
    updates: int


class KLController:
    """β of the KL-to-reference term, configured by a :class:`KLConfig`: constant, or moved
    once per rollout by the adaptive rule of this module's docstring."""

    def __init__(self, config: KLConfig) -> None:
        self.config = config
        self.control = config.control
        self.beta = config.beta
        self.target = config.target
        self.horizon = float(config.horizon)
        self.updates = 0
        self._sum: float | Tensor = 0.0
        self._count: int | Tensor = 0

    @property
    def enabled(self) -> bool:
        """Whether the loss computes the KL term at all (``kl.beta > 0``)."""
        return self.config.enabled

    def observe(self, kl: Tensor) -> None:
        """Accumulate the finite values of a per-sample ``kl[...]`` for this rollout's mean."""
        values = kl.detach().to(torch.float64).reshape(-1)
        finite = torch.isfinite(values)
        # device-side accumulation: read once per rollout in step(), not per trained step
        self._sum = self._sum + torch.where(finite, values, torch.zeros_like(values)).sum()
        self._count = self._count + finite.sum()

    def step(self, *, device: torch.device | str | None = None) -> dict[str, float]:
        """End of a rollout: the mean KL over all ranks and (adaptive) the next β.

        Every rank must call it (a collective when torch.distributed is initialised); all
        ranks then hold the same β. Returns ``kl/rollout_mean`` (NaN when nothing finite was
        observed; β is then left unchanged) and ``kl/beta_next``; ``{}`` when disabled.
        """
        if not self.enabled:
            return {}
        total, count = _reduce_sum_count(float(self._sum), int(self._count), device)
        self._sum, self._count = 0.0, 0
        mean = total / count if count > 0 else math.nan
        if self.control == "adaptive" and math.isfinite(mean):
            assert self.target is not None
            self.beta = adaptive_beta(self.beta, mean, self.target, self.horizon)
            self.updates += 1
        return {"kl/rollout_mean": mean, "kl/beta_next": self.beta}

    def state_dict(self) -> KLState:
        return {"control": self.control, "beta": self.beta, "updates": self.updates}

    def load_state_dict(self, state: KLState) -> None:
        """Restore β (adaptive only: a fixed β is the configuration, so resuming with a new
        ``kl.beta`` takes effect) and the update count."""
        missing = sorted({"control", "beta", "updates"} - set(state))
        if missing:
            raise ValueError(f"KL-controller state lacks {missing}; got keys {sorted(state)}")
        if self.control == "adaptive":
            self.beta = float(state["beta"])
        self.updates = int(state["updates"])


def kl_metrics(terms: dict[str, Tensor], beta: float) -> dict[str, float]:
    """``kl_loss`` (mean), ``kl/max``, ``kl/step_<k>`` (mean of column k of ``kl_steps[N, S]``,
    one column per trained step) and ``kl/beta`` (the β this step used); ``{}`` without KL."""
    if "kl" not in terms:
        return {}
    out = {
        "kl_loss": float(terms["kl"].float().mean()),
        "kl/max": float(terms["kl"].float().max()),
    }
    steps = terms.get("kl_steps")
    if steps is not None:
        per_step = steps.float().mean(dim=0)
        out.update({f"kl/step_{k}": float(v) for k, v in enumerate(per_step.tolist())})
    out["kl/beta"] = float(beta)
    return out
