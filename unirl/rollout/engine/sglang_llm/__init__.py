"""SGLang language-model rollout adapter (sglang is imported only when a server is used)."""

from __future__ import annotations

from unirl.rollout.engine.sglang_llm.engine import EngineContractError, SGLangLLMEngine

__all__ = ["EngineContractError", "SGLangLLMEngine"]
