"""UniRL reward service: a FastAPI app that scores images and videos with unirl's reward backends."""

from __future__ import annotations

__version__ = "0.1.0"

from unirl_reward_service.app import RewardServer, create_app
from unirl_reward_service.config import (
    RewardConfig,
    ServerConfig,
    ServiceConfig,
    load_config,
    parse_config,
)

__all__ = [
    "RewardConfig",
    "RewardServer",
    "ServerConfig",
    "ServiceConfig",
    "__version__",
    "create_app",
    "load_config",
    "parse_config",
]
