"""The tiny Qwen-style tokenizer of the VLM reward tests (``unirl.reward.local.vlm.tiny``)."""

from unirl.reward.local.vlm.tiny import QWEN_STYLE_TEMPLATE, SPECIALS, qwen_tokenizer

__all__ = ["QWEN_STYLE_TEMPLATE", "SPECIALS", "qwen_tokenizer"]
