"""``CausalLMBundleConfig``: the fields every autoregressive family's ``bundle:`` block has."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import torch

from unirl.config.precision import canonical_precision
from unirl.config.require import require
from unirl.config.typecheck import PositiveInt

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


@dataclasses.dataclass(kw_only=True)
class CausalLMBundleConfig:
    """What loads a causal LM and turns prompts into tokens.

    ``path``: ``tiny`` | an ``*-arch`` preset | a local ``save_pretrained`` folder | a hub id.
    ``dtype``: the weights' precision (the backend keeps what trains in fp32 anyway).
    ``device``: ``auto`` (the current CUDA device if there is one, else CPU), ``cpu``,
    ``cuda``, ``cuda:N``. ``attn_implementation``: transformers' attention kernel
    (``sdpa`` and ``flash_attention_2`` take packed rows through ``position_ids``; ``eager``
    only for debugging, it cannot).

    Prompts: with ``chat_template`` the prompt becomes one user turn of the tokenizer's chat
    template (``system_prompt`` first when set) with the generation prompt appended; without
    it the prompt text is used as it is (base models). ``response_prefix`` is text the
    response starts with (an assistant prefill): it ends the prompt tokens, is not trained,
    and is put back in front of the completion the reward reads. ``max_prompt_tokens``: a
    longer prompt is refused, naming it (never truncated silently).
    ``gradient_checkpointing``: recompute each decoder layer's activations in the backward
    (transformers' non-reentrant checkpointing). ``seed``: the random weights of an ``*-arch``
    preset (ignored for ``tiny``, folders and hub ids).
    """

    preset_names: ClassVar[tuple[str, ...]] = ("tiny",)

    path: str = "tiny"
    dtype: str = "bf16"
    device: str = "auto"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    gradient_checkpointing: bool = False
    chat_template: bool = True
    system_prompt: str | None = None
    response_prefix: str = ""
    max_prompt_tokens: PositiveInt = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        require(
            isinstance(self.path, str) and self.path.strip() != "",
            f"bundle.path must name a preset ({', '.join(self.preset_names)}), a local folder "
            "or a hub id",
        )
        self.dtype = canonical_precision(self.dtype, "bundle.dtype")
        require(
            self.attn_implementation in ATTN_IMPLEMENTATIONS,
            f"bundle.attn_implementation={self.attn_implementation!r} must be one of "
            f"{ATTN_IMPLEMENTATIONS}",
        )
        if self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                require(
                    False,
                    f"bundle.device={self.device!r} is not a device ({exc}); use auto, cpu, cuda "
                    "or cuda:N",
                )
        require(self.max_prompt_tokens >= 1, "bundle.max_prompt_tokens must be >= 1")

    def resolved_device(self) -> torch.device:
        """``device`` as a ``torch.device``; ``auto`` picks the current CUDA device or CPU."""
        if self.device == "auto":
            return (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        return torch.device(self.device)
