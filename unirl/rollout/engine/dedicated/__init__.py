from __future__ import annotations

from unirl.rollout.engine.dedicated.engine import DedicatedEngine, build_bundle, build_pipeline

__all__ = ["DedicatedEngine", "build_bundle", "build_pipeline"]
