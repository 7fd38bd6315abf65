"""``Qwen3Pipeline``: the shared causal-LM sampler and token policy under this family's name."""

from __future__ import annotations

from unirl.models.common_ar.pipeline import CausalLMPipeline


class Qwen3Pipeline(CausalLMPipeline):
    """:class:`~unirl.models.common_ar.pipeline.CausalLMPipeline` for a ``Qwen3Bundle``."""
