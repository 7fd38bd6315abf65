"""EditReward (Wu et al., 2025), the trained edit reward model: Qwen2.5-VL-7B sees the
source image, the edited image and the instruction twice, once with the instruction-following
prompt and once with the visual-quality prompt; a separate MLP head reads the hidden state at
``<|Reward|>`` of each pass, and the two predictions are pooled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from unirl.config import require
from unirl.reward.base import (
    EditRewardBackend,
    ScoreResult,
    check_images,
    check_lengths,
    images_to_uint8,
)
from unirl.reward.local.vlm.engine import QwenVLScorer, image_chat, ranknet_head
from unirl.reward.local.vlm.hpsv3 import HPSV3_PIXELS
from unirl.reward.local.vlm.templates import (
    EDITREWARD_FOLLOWING,
    EDITREWARD_QUALITY,
    EDITREWARD_SUFFIX,
    HPSV3_REWARD_TOKEN,
)

POOLINGS = ("mean", "min")
PROMPTS = (EDITREWARD_FOLLOWING, EDITREWARD_QUALITY)  # head_0, head_1


def edit_reward_text(instruction: str, head: int) -> str:
    """The text after the two images for head ``head`` (0: following, 1: quality)."""
    return PROMPTS[head].format(text_prompt=instruction) + EDITREWARD_SUFFIX


@dataclass(kw_only=True)
class EditReward(QwenVLScorer, EditRewardBackend):
    """The EditReward model's score of an edit (``score_edit``: result, source, instruction).

    For head ``k`` in (0: instruction following, 1: visual quality) one user turn shows the
    source, the result, then the released prompt ``k`` with the instruction and the
    ``<|Reward|>`` suffix; right padding, sequential positions. Head ``k`` (fp32, the ranknet
    MLP ``H -> 1024 -> 16 -> 2``) maps the hidden state at ``<|Reward|>`` to ``(μ_k, u_k)``;
    the released ``pooling_strategy: mean`` averages the two heads' outputs, so the score is
    ``(μ_0 + μ_1) / 2`` (``pooling: min`` takes the element-wise minimum instead).
    ``<name>/following`` and ``<name>/quality`` log ``μ_0`` and ``μ_1``.

    ``path``: a folder with the Qwen2.5-VL backbone, ``<|Reward|>`` in its tokenizer and
    ``reward_head.safetensors`` (keys ``rm_heads.head_{0,1}.{0,3,5}.{weight,bias}``), as
    ``python -m unirl.reward.local.vlm.convert --kind editreward`` writes. Images are resized
    to 256 merged patches each, as in the release.
    """

    path: str  # folder (or hub id) converted from the EditReward checkpoint: backbone, tokenizer with <|Reward|>, reward_head.safetensors
    name: str = "edit_reward"  # component name of the score
    batch_size: int = 4  # edits per forward pass (each edit is scored twice, once per head)
    min_pixels: int | None = (
        HPSV3_PIXELS  # each image's pixel lower bound after resizing (released: 200704)
    )
    max_pixels: int | None = (
        HPSV3_PIXELS  # each image's pixel upper bound after resizing (released: 200704)
    )
    pooling: str = "mean"  # how the two heads combine: mean (the release) or min

    reward_tokens: ClassVar[tuple[str, ...]] = (HPSV3_REWARD_TOKEN,)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.pooling in POOLINGS,
            f"EditReward.pooling={self.pooling!r}: use one of {', '.join(POOLINGS)}",
        )

    def _after_load(self) -> None:
        heads = nn.ModuleDict({f"head_{k}": ranknet_head(self.hidden_size, 2) for k in range(2)})
        self._load_head({"rm_heads": heads}, "EditReward heads rm_heads.head_0/1")

    def head_outputs(self, images: Tensor, sources: Tensor, prompts: list[str]) -> Tensor:
        """``[b, 2 heads, 2]`` float32: ``(μ_k, u_k)`` per head."""
        results, srcs = images_to_uint8(images), images_to_uint8(sources)
        visuals = [[("image", s), ("image", r)] for s, r in zip(srcs, results, strict=True)]
        outs = []
        for k in range(2):
            batch = self.build_batch(
                [image_chat(edit_reward_text(p, k), before=2) for p in prompts], visuals
            )
            hidden = self.hidden_at(batch, self.reward_tokens)[:, 0]
            outs.append(self._head.rm_heads[f"head_{k}"](hidden))
        return torch.stack(outs, dim=1)

    def pool(self, heads: Tensor) -> Tensor:
        """The pooled ``(μ, u)`` ``[b, 2]`` of ``heads[b, 2, 2]``."""
        return heads.mean(dim=1) if self.pooling == "mean" else heads.min(dim=1).values

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        return EditRewardBackend.score(self, images, prompts, metadata)

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "EditReward", metadata=metadata)
        images = check_images(images, n, "EditReward")
        sources = check_images(sources, n, "EditReward (sources)")

        def call(start: int, stop: int):
            heads = self.head_outputs(
                images[start:stop], sources[start:stop], list(prompts[start:stop])
            )
            extras = {"following": heads[:, 0, 0], "quality": heads[:, 1, 0]}
            return self.pool(heads)[:, 0], [None] * (stop - start), extras

        values, errors, metrics = self._chunked(n, call)
        return self._finish(values, errors, metrics)
