"""The tiny Qwen-style tokenizer of the VLM reward tests (``unirl.models.common.tiny_qwen``)."""

from unirl.models.common.tiny_qwen import QWEN_STYLE_TEMPLATE, SPECIALS, qwen_tokenizer

__all__ = ["QWEN_STYLE_TEMPLATE", "SPECIALS", "qwen_tokenizer"]
