"""DAPO's loss for autoregressive text tracks (Yu et al., 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale"; docs/math.md, "DAPO").

    r_t = π_θ(y_t) / π_old(y_t),   ℓ_t = max(−A_i r_t, −A_i clip(r_t, 1 − ε_low, 1 + ε_high))
    L   = Σ_{i, t} ℓ_t / Σ_i |y_i|                 (every loss token of the batch weighs the same)

The loss is GRPO's with clip-higher and the token-level mean fixed; the rest of DAPO lives
where it acts: dynamic sampling at the rollout seam (``dynamic_sampling`` in the recipe,
``unirl.trainer.dynamic_sampling``) and the overlong shaping in the reward
(``unirl.reward.local.OverlongPenalty``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from unirl.algorithms.grpo import GRPO, TokenPolicy
from unirl.algorithms.kl import KLConfig
from unirl.config.require import require


class DAPO(GRPO):
    """DAPO's loss (GRPO with clip-higher and the token-level mean).

    ``clip_low``: ε_low, the ratio's lower clip 1 − ε_low (0.2); ``clip_high``: ε_high, the
    upper clip 1 + ε_high (0.28, clip-higher: lets low-probability tokens rise);
    ``loss_agg``: must be ``token-mean`` (the sum over every loss token of the batch divided
    by their count, whatever the micro-batches); ``kl``: β·k3 to the reference as in GRPO
    (the paper uses none); ``old_logp_source``, ``tis_cap``: as GRPO."""

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        loss_agg: Literal["token-mean"] = "token-mean",
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: str = "replay",
        tis_cap: float | None = None,
    ) -> None:
        require(
            loss_agg == "token-mean",
            f"algorithm.loss_agg={loss_agg!r}: DAPO aggregates per token over the whole batch; "
            "set algorithm.loss_agg=token-mean (or use unirl.algorithms.GRPO)",
        )
        super().__init__(
            policy=policy,
            clip_low=clip_low,
            clip_high=clip_high,
            loss_agg=loss_agg,
            kl=kl,
            old_logp_source=old_logp_source,
            tis_cap=tis_cap,
        )
