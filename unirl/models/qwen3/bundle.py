"""``Qwen3Bundle``: Qwen3 causal LMs (dense) through transformers' ``Qwen3ForCausalLM``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common_ar.bundle import CausalLMBundle
from unirl.models.common_ar.sources import CausalLMSources
from unirl.models.common_ar.tiny import build_chat_tokenizer
from unirl.models.qwen3.arch import arch_config
from unirl.models.qwen3.config import Qwen3BundleConfig
from unirl.models.qwen3.presets import SOURCES, tiny_preset_path
from unirl.models.qwen3.tiny import TinyQwen3Spec, model_config

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Qwen3Bundle(CausalLMBundle):
    """A Qwen3 model and tokenizer: ``path`` = ``tiny`` | ``qwen3-*-arch`` | a local folder |
    a hub id (``Qwen/Qwen3-4B-Base``). Everything else is :class:`CausalLMBundle`."""

    config_class: ClassVar[type[Qwen3BundleConfig]] = Qwen3BundleConfig
    sources: ClassVar[CausalLMSources] = SOURCES
    block_class_names: ClassVar[tuple[str, ...]] = ("Qwen3DecoderLayer",)

    @classmethod
    def model_class(cls) -> type[nn.Module]:
        from transformers import Qwen3ForCausalLM

        return Qwen3ForCausalLM

    @classmethod
    def hf_config_class(cls) -> type:
        from transformers import Qwen3Config

        return Qwen3Config

    @classmethod
    def tiny_folder(cls) -> Path:
        return tiny_preset_path()

    @classmethod
    def arch_config(cls, name: str) -> ConfigDict:
        return arch_config(name)

    @classmethod
    def tiny_tokenizer(cls) -> PreTrainedTokenizerBase:
        spec = TinyQwen3Spec()
        return build_chat_tokenizer(spec.vocab_size, model_max_length=spec.max_position_embeddings)

    @classmethod
    def tiny_config(cls) -> ConfigDict:
        spec = TinyQwen3Spec()
        return model_config(spec, vocab_size=spec.vocab_size, eos_token_id=2, pad_token_id=0)
