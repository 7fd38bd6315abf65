"""The AR decode engine: continuous batching over a static KV cache, CUDA-graph decode steps
(see README.md of ``models/common_ar``, "Decode engine")."""

from unirl.models.common_ar.engine.decoder import DecoderView, MergedLinear, decoder_view
from unirl.models.common_ar.engine.slots import (
    DecodeEngine,
    DecodeEngineConfig,
    EngineStats,
    Prefix,
    hf_prefill,
)

__all__ = [
    "DecodeEngine",
    "DecodeEngineConfig",
    "DecoderView",
    "EngineStats",
    "MergedLinear",
    "Prefix",
    "decoder_view",
    "hf_prefill",
]
