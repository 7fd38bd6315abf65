"""LAION improved aesthetic predictor: a linear MLP on normalised CLIP ViT-L/14 image
embeddings (the DDPO / Flow-GRPO aesthetic reward)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from unirl.config import require
from unirl.reward.local._hf import PretrainedScorer, load_reward_mlp, load_state_dict_file
from unirl.reward.local.clip_score import clip_image_embeds, load_clip


@dataclass(kw_only=True)
class LaionAesthetic(PretrainedScorer):
    """Aesthetic score ``s = MLP(e / ||e||)``, ``e = visual_projection(vision pooler)`` of
    ``model`` (``openai/clip-vit-large-patch14``: 768-d), ``MLP`` = :class:`RewardMLP`
    (768 -> 1024 -> 128 -> 64 -> 16 -> 1, no activations, dropout off at eval) loaded from
    ``head``: a local ``.pth`` / ``.safetensors`` state dict such as
    ``sac+logos+ava1-l14-linearMSE.pth`` of christophschuhmann/improved-aesthetic-predictor
    (keys ``layers.{0,2,4,6,7}``). Scores are on the 1-10 rating scale of the training data
    (~4-7 for typical images). The prompt is ignored. The head runs in fp32. Returns ``score[N]``.
    """

    head: str
    model: str = "openai/clip-vit-large-patch14"
    processor: str | None = None
    name: str = "aesthetic"
    _bundle: Any = field(init=False, repr=False, default=None)
    _head: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.head), "LaionAesthetic.head: give the path of the MLP weights (.pth)")
        require(bool(self.model), "LaionAesthetic.model: give a CLIP folder or hub id")

    def _load(self) -> None:
        owner = type(self).__name__
        state = load_state_dict_file(self.head, owner=owner, field_name="head")
        bundle = load_clip(
            owner=owner,
            model=self.model,
            processor=self.processor,
            dtype=self.torch_dtype,
            device=self.torch_device,
            resize="shortest_crop",
            with_tokenizer=False,
        )
        width = int(bundle.model.config.projection_dim)
        head = load_reward_mlp(state, width, owner=owner, where=f"head={self.head!r}")
        self._bundle = bundle
        self._head = head.to(self.torch_device)

    def _modules(self) -> list[nn.Module]:
        modules = [self._bundle.model if self._bundle is not None else None, self._head]
        return [m for m in modules if m is not None]

    def _score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        embeds = clip_image_embeds(self._bundle, images)
        return self._head(embeds.to(torch.float32))
