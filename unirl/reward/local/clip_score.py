"""CLIP score: ``scale · cos(image embedding, text embedding)`` of a transformers ``CLIPModel``,
plus the CLIP loading / embedding helpers that PickScore, HPS v2 and the aesthetic scorer share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unirl.config import require
from unirl.reward.local._hf import (
    ImagePreprocess,
    PretrainedScorer,
    ResizeMode,
    RewardWeightsNotFound,
    load_pretrained,
    read_pretrained_json,
)


@dataclass
class CLIPBundle:
    """A loaded ``CLIPModel`` with its tokenizer (``None`` if image-only) and preprocessing."""

    model: Any
    tokenizer: Any
    preprocess: ImagePreprocess
    max_length: int


def load_clip(
    *,
    owner: str,
    model: str,
    processor: str | None,
    dtype: torch.dtype,
    device: torch.device,
    resize: ResizeMode,
    max_length: int = 77,
    with_tokenizer: bool = True,
) -> CLIPBundle:
    """Load ``CLIPModel`` from ``model`` and tokenizer + ``preprocessor_config.json`` from
    ``processor`` (default: ``model``). Raises ``RewardWeightsNotFound`` with the fix."""
    from transformers import AutoTokenizer, CLIPModel

    clip = load_pretrained(
        CLIPModel.from_pretrained, model, owner=owner, field_name="model", dtype=dtype
    )
    clip = clip.to(device).eval()  # type: ignore[arg-type]  # transformers' _Wrapped.to
    source, source_field = (processor, "processor") if processor else (model, "model")
    tokenizer = None
    if with_tokenizer:
        tokenizer = load_pretrained(
            AutoTokenizer.from_pretrained, source, owner=owner, field_name=source_field
        )
    config = read_pretrained_json(
        source, "preprocessor_config.json", owner=owner, field_name=source_field
    )
    if config is None:
        raise RewardWeightsNotFound(
            f"{owner}: {source_field}={source!r} has no preprocessor_config.json (image size, "
            "mean, std); save the CLIP processor into that folder "
            "(CLIPProcessor.from_pretrained(...).save_pretrained(folder)) or set processor= to a "
            "folder or hub id that has one"
        )
    preprocess = ImagePreprocess.from_processor_config(config, mode=resize)
    image_size = int(clip.config.vision_config.image_size)
    require(
        preprocess.crop_size == image_size,
        f"{owner}: the preprocessor crops to {preprocess.crop_size} px but the CLIP vision tower "
        f"of {model!r} expects {image_size} px; point processor= at the matching processor",
    )
    length = min(int(max_length), int(clip.config.text_config.max_position_embeddings))
    return CLIPBundle(model=clip, tokenizer=tokenizer, preprocess=preprocess, max_length=length)


def clip_image_embeds(bundle: CLIPBundle, images: Tensor) -> Tensor:
    """L2-normalised image embeddings ``[b, D]`` float32 of ``images[b, 3, H, W]`` in [0, 1]."""
    clip = bundle.model
    pixels = bundle.preprocess(images).to(dtype=clip.dtype)
    pooled = clip.vision_model(pixel_values=pixels).pooler_output
    return F.normalize(clip.visual_projection(pooled).float(), dim=-1)


def clip_text_embeds(bundle: CLIPBundle, prompts: list[str]) -> Tensor:
    """L2-normalised text embeddings ``[b, D]`` float32; each distinct prompt is encoded once
    (padding to the longest, truncation at ``max_length``; the causal text tower makes the
    EOS feature independent of the padding)."""
    clip = bundle.model
    unique = list(dict.fromkeys(prompts))
    tokens = bundle.tokenizer(
        unique, padding=True, truncation=True, max_length=bundle.max_length, return_tensors="pt"
    )
    device = clip.device
    pooled = clip.text_model(
        input_ids=tokens["input_ids"].to(device),
        attention_mask=tokens["attention_mask"].to(device),
    ).pooler_output
    embeds = F.normalize(clip.text_projection(pooled).float(), dim=-1)
    index = torch.tensor([unique.index(p) for p in prompts], device=embeds.device)
    return embeds[index]


@dataclass(kw_only=True)
class CLIPSimilarityScorer(PretrainedScorer):
    """Shared body of the CLIP-architecture scorers: ``_scale(cos[b]) -> score[b]``.

    ``model``: a local ``save_pretrained`` folder or a hub id of a transformers ``CLIPModel``;
    ``processor``: where the tokenizer and ``preprocessor_config.json`` live (default
    ``model``); ``resize``: ``shortest_crop`` (CLIPProcessor) or ``longest_pad`` (open_clip).
    ``max_length``: the prompt's token limit (capped at the model's position limit; longer
    prompts are truncated).
    """

    model: str
    processor: str | None = None
    max_length: int = 77
    resize: str = "shortest_crop"
    _bundle: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        require(bool(self.model), f"{owner}.model: give a CLIP folder or hub id")
        require(
            self.resize in ("shortest_crop", "longest_pad"),
            f"{owner}.resize={self.resize!r}: use 'shortest_crop' or 'longest_pad'",
        )
        require(self.max_length >= 2, f"{owner}.max_length must be >= 2 tokens")

    def _load(self) -> None:
        self._bundle = load_clip(
            owner=type(self).__name__,
            model=self.model,
            processor=self.processor,
            dtype=self.torch_dtype,
            device=self.torch_device,
            resize=cast(ResizeMode, self.resize),  # checked in __post_init__
            max_length=self.max_length,
        )

    def _modules(self) -> list[nn.Module]:
        return [self._bundle.model] if self._bundle is not None else []

    def cosine(self, images: Tensor, prompts: list[str]) -> Tensor:
        """``cos(image_i, text_i)[b]`` float32 (loads the model on first use)."""
        self._ensure_ready()
        assert self._bundle is not None
        with torch.no_grad():
            image = clip_image_embeds(self._bundle, images.to(self.torch_device))
            text = clip_text_embeds(self._bundle, prompts)
        return (image * text).sum(dim=-1)

    def logit_scale(self) -> Tensor:
        """``exp(logit_scale)`` of the loaded model (a float32 scalar)."""
        assert self._bundle is not None
        return self._bundle.model.logit_scale.detach().float().exp()

    def _score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self._scale(self.cosine(images, prompts))

    def _scale(self, cosine: Tensor) -> Tensor:
        raise NotImplementedError


@dataclass(kw_only=True)
class CLIPScore(CLIPSimilarityScorer):
    """CLIP score: ``s = scale · cos(E_img(x), E_txt(p))``, then ``max(s, 0)`` if
    ``clamp_min_zero`` (the torchmetrics / CLIPScore convention, default).

    ``E_img`` = ``visual_projection(vision pooler)``, ``E_txt`` = ``text_projection(EOS
    state)``; ``scale=100`` by default, ``scale=None`` uses the model's ``exp(logit_scale)``
    (100 for the OpenAI checkpoints). Images are preprocessed in torch (``shortest_crop``,
    mean/std of the model's ``preprocessor_config.json``). Returns ``score[N]``.
    """

    model: str = "openai/clip-vit-large-patch14"
    name: str = "clip_score"
    scale: float | None = 100.0
    clamp_min_zero: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.scale is None or self.scale > 0,
            f"CLIPScore.scale={self.scale!r}: use a positive number, or null for exp(logit_scale)",
        )

    def _scale(self, cosine: Tensor) -> Tensor:
        scale = self.logit_scale().to(cosine.device) if self.scale is None else self.scale
        score = scale * cosine
        return score.clamp_min(0.0) if self.clamp_min_zero else score
