"""HPSv3 (Ma et al., 2025): a Qwen2-VL-7B backbone whose hidden state at the ``<|Reward|>``
token feeds a small MLP head that predicts a Gaussian over human preference,
``(μ, uncertainty)``; the score is ``μ``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from unirl.reward.base import ScoreResult, check_images, check_lengths, images_to_uint8
from unirl.reward.local.vlm.engine import QwenVLScorer, image_chat, ranknet_head
from unirl.reward.local.vlm.templates import HPSV3_INSTRUCTION, HPSV3_REWARD_TOKEN, HPSV3_SUFFIX

HPSV3_PIXELS = 256 * 28 * 28  # the released collator fixes min_pixels = max_pixels


def hpsv3_text(prompt: str) -> str:
    """The text after the image in HPSv3's user turn."""
    return HPSV3_INSTRUCTION.format(text_prompt=prompt) + HPSV3_SUFFIX


@dataclass(kw_only=True)
class HPSv3(QwenVLScorer):
    """HPSv3 preference score of an image for its prompt.

    One user turn, the image then :data:`~unirl.reward.local.vlm.templates.HPSV3_INSTRUCTION`
    with the prompt and the ``<|Reward|>`` suffix, rendered by the folder's chat template with
    the generation prompt; the batch is padded on the right and run once with sequential
    positions. ``h`` = the last hidden state at ``<|Reward|>``; the head (fp32)
    ``Linear(H, 1024) -> ReLU -> Dropout(0.05) -> Linear(1024, 16) -> ReLU -> Linear(16, 2)``
    gives ``(μ, u)``; the score is ``μ`` (``<name>/uncertainty`` logs the mean ``u``).

    ``path``: a folder (or hub id) holding the Qwen2-VL backbone with ``<|Reward|>`` in its
    tokenizer and ``reward_head.safetensors`` (keys ``rm_head.{0,3,5}.{weight,bias}``), as
    ``python -m unirl.reward.local.vlm.convert --kind hpsv3`` writes from ``HPSv3.safetensors``.
    Images are resized to 256 merged patches (``min_pixels = max_pixels = 200704``).
    """

    path: str  # folder (or hub id) converted from MizzenAI/HPSv3: backbone, tokenizer with <|Reward|>, reward_head.safetensors
    name: str = "hpsv3"  # component name of the score
    batch_size: int = 8  # images per forward pass
    min_pixels: int | None = (
        HPSV3_PIXELS  # each image's pixel lower bound after resizing (released: 200704)
    )
    max_pixels: int | None = (
        HPSV3_PIXELS  # each image's pixel upper bound after resizing (released: 200704)
    )

    reward_tokens: ClassVar[tuple[str, ...]] = (HPSV3_REWARD_TOKEN,)

    def _after_load(self) -> None:
        self._load_head({"rm_head": ranknet_head(self.hidden_size, 2)}, "HPSv3 head rm_head")

    def head_outputs(self, images: Tensor, prompts: list[str]) -> Tensor:
        """``(μ, u)`` per image, ``[b, 2]`` float32."""
        batch = self.build_batch(
            [image_chat(hpsv3_text(p)) for p in prompts],
            [[("image", a)] for a in images_to_uint8(images)],
        )
        hidden = self.hidden_at(batch, self.reward_tokens)[:, 0]
        return self._head.rm_head(hidden)

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "HPSv3", metadata=metadata)
        images = check_images(images, n, "HPSv3")

        def call(start: int, stop: int):
            out = self.head_outputs(images[start:stop], list(prompts[start:stop]))
            return out[:, 0], [None] * (stop - start), {"uncertainty": out[:, 1]}

        values, errors, metrics = self._chunked(n, call)
        return self._finish(values, errors, metrics)


__all__ = ["HPSV3_PIXELS", "HPSv3", "hpsv3_text"]
