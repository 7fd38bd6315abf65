"""Reference-policy control: the coefficient β of the KL-to-reference term, fixed or adaptive.

Every diffusion loss (FlowGRPO, FlowDPPO, DiffusionNFT) adds ``β · mean KL`` to its loss and
feeds each measured per-sample KL to :meth:`KLController.observe`. After the optimizer steps
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
from typing import Any, Literal

import torch
from torch import Tensor

from unirl.config.require import require

KL_CONTROLS = ("fixed", "adaptive")
ERROR_CLIP = 0.2  # |e| bound of the proportional controller


def adaptive_beta(beta: float, kl: float, target: float, horizon: float) -> float:
    """One controller update: ``β · (1 + clip(kl / target − 1, ±0.2) / horizon)``."""
    error = min(max(kl / target - 1.0, -ERROR_CLIP), ERROR_CLIP)
    return beta * (1.0 + error / horizon)


def _reduce_sum_count(total: float, count: int, device: Any) -> tuple[float, int]:
    """Sum ``(total, count)`` over every rank when torch.distributed is initialised."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return total, count
    if device is None:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0]), round(float(t[1]))


class KLController:
    """β of the KL-to-reference term.

    ``beta``: the initial (``adaptive``) or constant (``fixed``) β; 0 switches the KL term off
    (no reference forward at all). ``target``: the KL the adaptive controller steers toward,
    in the units of the loss's KL (per-sample mean over C·H·W of one step). ``horizon``
    (rollouts, >= 1): how slowly β follows.
    """

    def __init__(
        self,
        *,
        beta: float,
        control: Literal["fixed", "adaptive"] = "fixed",
        target: float | None = None,
        horizon: float = 10.0,
    ) -> None:
        require(math.isfinite(beta) and beta >= 0, f"algorithm.kl_beta must be >= 0, got {beta}")
        require(
            control in KL_CONTROLS,
            f"algorithm.kl_control must be 'fixed' or 'adaptive', got {control!r}",
        )
        if control == "adaptive":
            require(
                beta > 0,
                "algorithm.kl_control=adaptive scales β multiplicatively from kl_beta, so "
                "kl_beta must be > 0 (the initial β)",
            )
            require(
                target is not None and math.isfinite(target) and target > 0,
                f"algorithm.kl_target must be a KL > 0 with kl_control=adaptive, got {target}",
            )
            require(
                math.isfinite(horizon) and horizon >= 1,
                f"algorithm.kl_horizon must be >= 1 rollout, got {horizon}",
            )
        else:
            require(
                target is None,
                "algorithm.kl_target is used only by kl_control=adaptive; set kl_control=adaptive "
                "or kl_target=null",
            )
        self.control = control
        self.initial_beta = beta
        self.beta = beta
        self.target = None if target is None else float(target)
        self.horizon = float(horizon)
        self.updates = 0
        self._sum: float | Tensor = 0.0
        self._count: int | Tensor = 0

    @property
    def enabled(self) -> bool:
        """Whether the loss computes the KL term at all (``kl_beta > 0``)."""
        return self.initial_beta > 0

    def observe(self, kl: Tensor) -> None:
        """Accumulate the finite values of a per-sample ``kl[...]`` for this rollout's mean."""
        values = kl.detach().to(torch.float64).reshape(-1)
        finite = torch.isfinite(values)
        # device-side accumulation: read once per rollout in step(), not per trained step
        self._sum = self._sum + torch.where(finite, values, torch.zeros_like(values)).sum()
        self._count = self._count + finite.sum()

    def step(self, *, device: Any = None) -> dict[str, float]:
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

    def state_dict(self) -> dict[str, Any]:
        return {"control": self.control, "beta": self.beta, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore β (adaptive only: a fixed β is the configuration, so resuming with a new
        ``kl_beta`` takes effect) and the update count."""
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
