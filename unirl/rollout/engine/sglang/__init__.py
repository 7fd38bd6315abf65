"""SGLang adapter (``sglang.multimodal_gen`` diffusion server); sglang loads only when an
engine is built without an injected client."""

from __future__ import annotations

from unirl.rollout.engine.sglang.engine import SGLangEngine

__all__ = ["SGLangEngine"]
