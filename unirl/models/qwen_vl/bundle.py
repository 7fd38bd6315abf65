"""``QwenVLBundle``: Qwen2.5-VL through transformers' ``Qwen2_5_VLForConditionalGeneration``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from unirl.models.common.config_dict import ConfigDict
from unirl.models.common.text_encode import token_id
from unirl.models.common_ar.bundle import CausalLMBundle
from unirl.models.common_ar.prompts import PromptFormatter
from unirl.models.common_ar.sources import CausalLMSources
from unirl.models.qwen_vl.arch import arch_config
from unirl.models.qwen_vl.config import QwenVLBundleConfig
from unirl.models.qwen_vl.presets import SOURCES, tiny_preset_path
from unirl.models.qwen_vl.prompts import IMAGE_PAD, VISION_END, VISION_START, VisionPromptFormatter
from unirl.models.qwen_vl.tiny import VIDEO_PAD, TinyQwenVLSpec, build_tokenizer, model_config

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class QwenVLBundle(CausalLMBundle):
    """A Qwen2.5-VL model and tokenizer: ``path`` = ``tiny`` | ``qwen2.5-vl-{3b,7b}-arch`` | a
    local folder | a hub id (``Qwen/Qwen2.5-VL-7B-Instruct``). Prompts carry one image each
    (``VisionPromptFormatter``); everything else is :class:`CausalLMBundle`. LoRA defaults to
    the language model's attention projections (``self_attn.*``; MLP suffixes would also match
    the vision tower's blocks)."""

    config_class: ClassVar[type[QwenVLBundleConfig]] = QwenVLBundleConfig
    formatter_class: ClassVar[type[PromptFormatter]] = VisionPromptFormatter
    sources: ClassVar[CausalLMSources] = SOURCES
    block_class_names: ClassVar[tuple[str, ...]] = (
        "Qwen2_5_VLDecoderLayer",
        "Qwen2_5_VLVisionBlock",
    )
    lora_default_targets: ClassVar[tuple[str, ...]] = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
    )

    @classmethod
    def model_class(cls) -> type[nn.Module]:
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration

    @classmethod
    def hf_config_class(cls) -> type:
        from transformers import Qwen2_5_VLConfig

        return Qwen2_5_VLConfig

    @classmethod
    def tiny_folder(cls) -> Path:
        return tiny_preset_path()

    @classmethod
    def arch_config(cls, name: str) -> ConfigDict:
        """The released shapes, with the vision-token ids of the tokenizer the arch presets
        borrow (the tiny one), so its image placeholders are the model's."""
        config = arch_config(name)
        tokenizer = cls.tiny_tokenizer()
        ids = {
            "image_token_id": IMAGE_PAD,
            "video_token_id": VIDEO_PAD,
            "vision_start_token_id": VISION_START,
            "vision_end_token_id": VISION_END,
        }
        config.update({k: token_id(tokenizer, v) for k, v in ids.items()})
        return config

    @classmethod
    def tiny_tokenizer(cls) -> PreTrainedTokenizerBase:
        return build_tokenizer(TinyQwenVLSpec())

    @classmethod
    def tiny_config(cls) -> ConfigDict:
        spec = TinyQwenVLSpec()
        return model_config(spec, build_tokenizer(spec))
