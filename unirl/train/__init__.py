"""Training: FSDPBackend and TrainStack (its knobs: TrainStackConfig)."""

from __future__ import annotations

from unirl.train.backend import FSDPBackend
from unirl.train.checkpoint import CheckpointError
from unirl.train.ema import EMAConfig
from unirl.train.lora import LoraConfig
from unirl.train.optim import LRScheduleConfig, OptimizerConfig
from unirl.train.parallel import FSDPConfig
from unirl.train.stack import NonFiniteError, TrainStack, TrainStackConfig

__all__ = [
    "CheckpointError",
    "EMAConfig",
    "FSDPBackend",
    "FSDPConfig",
    "LRScheduleConfig",
    "LoraConfig",
    "NonFiniteError",
    "OptimizerConfig",
    "TrainStack",
    "TrainStackConfig",
]
