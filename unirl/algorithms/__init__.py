"""Loss nodes: ``StageAlgorithm`` and its implementations (see README.md)."""

from __future__ import annotations

from unirl.algorithms.advantages import gdpo_advantages
from unirl.algorithms.base import StageAlgorithm, StepResult
from unirl.algorithms.dapo import DAPO
from unirl.algorithms.ddpo import DDPO, DPOK
from unirl.algorithms.diffusionnft import DiffusionNFT, OldAdapterEMA, nft_loss
from unirl.algorithms.drpo import DRPO
from unirl.algorithms.flowdppo import FlowDPPO
from unirl.algorithms.flowgrpo import FlowGRPO
from unirl.algorithms.grpo import GRPO, GSPO, TokenPolicy, TokenPolicyLoss
from unirl.algorithms.kl import KLConfig
from unirl.algorithms.ppo import PPO, TokenValuePolicy
from unirl.algorithms.reinforcepp import ReinforcePP

__all__ = [
    "DAPO",
    "DDPO",
    "DPOK",
    "DRPO",
    "GRPO",
    "GSPO",
    "PPO",
    "DiffusionNFT",
    "FlowDPPO",
    "FlowGRPO",
    "KLConfig",
    "OldAdapterEMA",
    "ReinforcePP",
    "StageAlgorithm",
    "StepResult",
    "TokenPolicy",
    "TokenPolicyLoss",
    "TokenValuePolicy",
    "gdpo_advantages",
    "nft_loss",
]
