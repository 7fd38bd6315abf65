"""DRPO for autoregressive text tracks: a quadratic trust region instead of a clip.

    L_t = −A_t·r_t + |A_t|·w_t·(r_t − 1)² / (2ε),   w_t = p_old(y_t) if token-adaptive else 1

The penalty pulls r back toward 1; the per-token optimum is r = 1 + ε·sign(A)/w_t, so ε
plays the role of PPO's clip range and, with ``token_adaptive``, a rare token (small
p_old) gets proportionally more room to move. The gradient never vanishes (no clip).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from unirl.algorithms.grpo import TokenPolicy, TokenPolicyLoss
from unirl.algorithms.kl import KLConfig
from unirl.algorithms.losses import drpo_loss
from unirl.config.require import require


class DRPO(TokenPolicyLoss):
    """DRPO on a ``TextSegment``. ``epsilon`` is ε; ``token_adaptive`` weights the penalty by
    the old token probability. Everything else (anchoring, KL, aggregation) is
    :class:`~unirl.algorithms.grpo.TokenPolicyLoss`."""

    def __init__(
        self,
        *,
        policy: TokenPolicy,
        epsilon: float = 0.2,
        token_adaptive: bool = True,
        loss_agg: str = "token-mean",
        norm_length: int | None = None,
        kl: KLConfig | Mapping[str, object] | None = None,
        old_logp_source: str = "replay",
        tis_cap: float | None = None,
    ) -> None:
        require(epsilon > 0, f"algorithm.epsilon must be > 0, got {epsilon}")
        super().__init__(
            policy=policy,
            loss_agg=loss_agg,
            norm_length=norm_length,
            kl=kl,
            old_logp_source=old_logp_source,
            tis_cap=tis_cap,
        )
        self.epsilon = epsilon
        self.token_adaptive = token_adaptive

    def token_terms(
        self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, adv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return drpo_loss(log_prob, old_log_prob, adv, self.epsilon, self.token_adaptive)
