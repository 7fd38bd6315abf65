"""``VisionPromptFormatter``: one image per prompt, placed before the text in the user turn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from unirl.models.common.text_encode import token_id
from unirl.models.common_ar.prompts import PromptFormatter
from unirl.models.qwen_vl.vision import image_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from unirl.models.qwen_vl.config import QwenVLBundleConfig

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"


class VisionPromptFormatter(PromptFormatter):
    """The prompt's user turn starts with ``<|vision_start|><|image_pad|><|vision_end|>``;
    the single ``<|image_pad|>`` becomes as many as the image takes
    (``image_tokens(image_size, image_size)``)."""

    def __init__(
        self,
        config: QwenVLBundleConfig,
        tokenizer: PreTrainedTokenizerBase,
        stop_ids: Sequence[int],
    ) -> None:
        super().__init__(config, tokenizer, stop_ids)
        self.image_token_id = token_id(tokenizer, IMAGE_PAD)
        # the vision markers only ever come from the prompt: a generated one would ask the
        # model for an image that is not there
        vision = (VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>")
        ids = [tokenizer.convert_tokens_to_ids(t) for t in vision]
        unk = getattr(tokenizer, "unk_token_id", None)
        self.suppressed_token_ids = tuple(i for i in ids if isinstance(i, int) and i != unk)
        size = int(config.image_size)
        self.tokens_per_image = image_tokens(size, size)

    def prompt_text(self, prompt: str) -> str:
        return super().prompt_text(f"{VISION_START}{IMAGE_PAD}{VISION_END}{prompt}")

    def encode_prompts(self, prompts: Sequence[str]) -> list[list[int]]:
        out = []
        for ids in super().encode_prompts(prompts):
            if ids.count(self.image_token_id) != 1:
                raise ValueError(
                    f"a prompt holds {ids.count(self.image_token_id)} image placeholders after "
                    "formatting; the text must not contain <|image_pad|> itself"
                )
            at = ids.index(self.image_token_id)
            out.append(ids[:at] + [self.image_token_id] * self.tokens_per_image + ids[at + 1 :])
        return out
