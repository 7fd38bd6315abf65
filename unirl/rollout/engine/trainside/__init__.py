from __future__ import annotations

from unirl.rollout.engine.trainside.engine import TrainsideEngine

__all__ = ["TrainsideEngine"]
