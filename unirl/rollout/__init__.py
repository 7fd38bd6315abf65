"""Rollout engines: RolloutReq -> RolloutResp (see README.md)."""

from __future__ import annotations

from unirl.rollout.engine.trainside import TrainsideEngine

__all__ = ["TrainsideEngine"]
