"""vLLM-Omni adapter; vllm_omni loads only when an engine is built without an injected backend."""

from __future__ import annotations

from unirl.rollout.engine.vllm_omni.engine import VllmOmniEngine

__all__ = ["VllmOmniEngine"]
