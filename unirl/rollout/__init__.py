"""Rollout engines: RolloutReq -> RolloutResp (see README.md).

``SGLangEngine`` and ``VllmOmniEngine`` import their serving stacks lazily (only when built),
so importing this package never loads sglang or vllm.
"""

from __future__ import annotations

from unirl.rollout.engine.dedicated import DedicatedEngine
from unirl.rollout.engine.sglang import SGLangEngine
from unirl.rollout.engine.trainside import TrainsideEngine
from unirl.rollout.engine.vllm_omni import VllmOmniEngine

__all__ = ["DedicatedEngine", "SGLangEngine", "TrainsideEngine", "VllmOmniEngine"]
