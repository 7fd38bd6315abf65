"""UniRL reward service: a FastAPI app that scores images and videos with unirl's reward backends."""

from __future__ import annotations

__version__ = "0.1.0"


def _require_unirl() -> None:
    """UniRL is the distribution ``unirl-mm`` of this repository, which the public package
    index does not hold (its ``unirl`` is another project): say how to install it rather than
    fail on an import below."""
    try:
        import unirl.reward  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "unirl-reward-service needs UniRL installed from its repository first: "
            "pip install -e <UniRL clone> (the distribution unirl-mm; the `unirl` on the public "
            f"package index is a different project). Importing unirl.reward failed: {exc}"
        ) from exc


_require_unirl()  # before the modules below, which import unirl

from unirl_reward_service.app import RewardServer, create_app  # noqa: E402
from unirl_reward_service.config import (  # noqa: E402
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
