"""Detectors and colour classifiers behind GenEval's rule layer.

- :class:`Mask2FormerDetector`: a transformers ``Mask2FormerForUniversalSegmentation`` (COCO
  instance segmentation) with the mmdet instance post-processing the benchmark's evaluator
  ran: softmax over classes without "no object", the top ``max_per_image`` (query, class)
  pairs, masks ``logit > 0`` at image resolution, score = class probability · mean mask
  probability inside the mask, box = the mask's extent ``(x0, y0, x1 + 1, y1 + 1)``.
- :class:`CLIPColourClassifier`: the benchmark's zero-shot colour classifier: each crop is
  the object's box cut from the image with the pixels outside its mask painted grey
  (``#999999``), and the colour is the argmax over :data:`COLORS` of ``cos(image, text)``
  where a colour's text embedding is the normalised mean of three normalised templates.
- :class:`ColourBlobDetector` / :class:`MeanColourClassifier`: cheap deterministic
  stand-ins (connected regions of saturated pixels; nearest reference colour of the mean
  pixel) for tests and the CPU quick-start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from unirl.config import require
from unirl.config.precision import canonical_precision, parse_dtype
from unirl.reward.local.geneval.rules import COLORS, Detection

if TYPE_CHECKING:
    from transformers import Mask2FormerForUniversalSegmentation

    from unirl.reward.local.clip_score import CLIPBundle

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
CROP_BACKGROUND = 153.0 / 255.0  # "#999"
COLOUR_TEMPLATES = (
    "a photo of a {c} {classname}",
    "a photo of a {c}-colored {classname}",
    "a photo of a {c} object",
)

REFERENCE_RGB: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "orange": (1.0, 0.55, 0.0),
    "yellow": (0.95, 0.9, 0.1),
    "green": (0.1, 0.7, 0.2),
    "blue": (0.1, 0.2, 0.9),
    "purple": (0.5, 0.1, 0.6),
    "pink": (1.0, 0.6, 0.75),
    "brown": (0.45, 0.3, 0.15),
    "black": (0.05, 0.05, 0.05),
    "white": (0.97, 0.97, 0.97),
}
"""Reference colours of :class:`MeanColourClassifier` (and the renderers of the tests)."""


class Detector(Protocol):
    def detect(self, images: Tensor) -> list[list[Detection]]:
        """``images[N, 3, H, W]`` in [0, 1] -> per image its detections (any order)."""
        ...


class ColourClassifier(Protocol):
    def classify(self, image: Tensor, objects: list[Detection], classname: str) -> list[str]:
        """One colour of :data:`COLORS` per object of ``image[3, H, W]`` in [0, 1]."""
        ...


def mask_to_box(mask: Tensor) -> tuple[float, float, float, float]:
    """``(x0, y0, x1 + 1, y1 + 1)`` of a ``bool[H, W]`` mask's pixels; zeros when empty."""
    cols = torch.nonzero(mask.any(dim=0)).flatten()
    rows = torch.nonzero(mask.any(dim=1)).flatten()
    if len(cols) == 0 or len(rows) == 0:
        return (0.0, 0.0, 0.0, 0.0)
    return (float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1))


def object_crop(image: Tensor, obj: Detection, background: float = CROP_BACKGROUND) -> Tensor:
    """``crop[3, h, w]``: ``image`` outside ``obj.mask`` painted ``background``, cut to the box
    (coordinates rounded; at least one pixel)."""
    if obj.mask is not None:
        mask = torch.as_tensor(obj.mask, dtype=torch.bool, device=image.device)
        require(
            tuple(mask.shape) == tuple(image.shape[-2:]),
            f"object_crop: mask {tuple(mask.shape)} does not match image {tuple(image.shape)}",
        )
        image = torch.where(mask, image, torch.full_like(image, background))
    height, width = image.shape[-2:]
    x0, y0, x1, y1 = (round(v) for v in obj.box)
    x0, y0 = min(max(x0, 0), width - 1), min(max(y0, 0), height - 1)
    x1, y1 = max(min(x1, width), x0 + 1), max(min(y1, height), y0 + 1)
    return image[:, y0:y1, x0:x1]


# -- cheap deterministic stand-ins ----------------------------------------------------------
def connected_components(mask: np.ndarray) -> np.ndarray:
    """4-connected labels of a ``bool[H, W]`` mask: ``int[H, W]``, 0 background, components
    numbered 1.. in raster order of their first pixel."""
    height, width = mask.shape
    big = height * width + 1
    labels = np.where(mask, np.arange(1, big, dtype=np.int64).reshape(height, width), big)
    while True:
        padded = np.pad(labels, 1, constant_values=big)
        best = np.minimum.reduce(
            [
                labels,
                padded[:-2, 1:-1],
                padded[2:, 1:-1],
                padded[1:-1, :-2],
                padded[1:-1, 2:],
            ]
        )
        best = np.where(mask, best, big)
        if np.array_equal(best, labels):
            break
        labels = best
    out = np.zeros((height, width), dtype=np.int64)
    for index, value in enumerate(np.unique(labels[mask]), start=1):
        out[labels == value] = index
    return out


@dataclass(kw_only=True)
class ColourBlobDetector:
    """Coloured blobs: each pixel whose chroma (``max - min`` over RGB) is at least
    ``min_chroma`` takes the nearest colour of ``colours`` (:data:`REFERENCE_RGB`, Euclidean);
    every 4-connected region of one colour is an object named ``label`` (``{colour}`` in it is
    replaced by the region's colour: ``"{colour} blob"`` names ``red blob``, ...), scored
    ``min(1, area / (full_score_fraction · H·W))``: ``full_score_fraction`` is the share of the
    image a region must cover to score 1. Deterministic, no weights: for tests and
    the CPU quick-start, not for benchmark numbers."""

    label: str = "blob"
    colours: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "purple", "pink")
    min_chroma: float = 0.25
    full_score_fraction: float = 0.25

    def __post_init__(self) -> None:
        self.colours = tuple(self.colours)
        unknown = [c for c in self.colours if c not in REFERENCE_RGB]
        require(
            bool(self.colours) and not unknown,
            f"ColourBlobDetector.colours: {unknown or 'empty'}; use names of {list(REFERENCE_RGB)}",
        )
        require(0.0 < self.min_chroma <= 1.0, "ColourBlobDetector.min_chroma must be in (0, 1]")
        require(
            0.0 < self.full_score_fraction <= 1.0,
            "ColourBlobDetector.full_score_fraction must be in (0, 1]",
        )

    def detect(self, images: Tensor) -> list[list[Detection]]:
        table = torch.tensor([REFERENCE_RGB[c] for c in self.colours], dtype=torch.float32)
        out = []
        for image in images.detach().to(torch.float32).cpu():
            height, width = image.shape[-2:]
            chroma = image.max(dim=0).values - image.min(dim=0).values
            pixels = image.permute(1, 2, 0).reshape(-1, 3)
            nearest = torch.cdist(pixels, table).argmin(dim=1).reshape(height, width)
            found = []
            for index in range(len(self.colours)):
                labels = connected_components(
                    ((nearest == index) & (chroma >= self.min_chroma)).numpy()
                )
                for component in range(1, int(labels.max(initial=0)) + 1):
                    region = torch.from_numpy(labels == component)
                    score = min(
                        1.0, float(region.sum()) / (self.full_score_fraction * height * width)
                    )
                    name = self.label.format(colour=self.colours[index])
                    found.append(Detection(name, mask_to_box(region), score, region.numpy()))
            out.append(found)
        return out


@dataclass(kw_only=True)
class MeanColourClassifier:
    """The colour of :data:`REFERENCE_RGB` nearest (Euclidean) to the mean pixel of the
    object's mask (its box when maskless)."""

    def classify(self, image: Tensor, objects: list[Detection], classname: str) -> list[str]:
        names = list(REFERENCE_RGB)
        table = torch.tensor([REFERENCE_RGB[c] for c in names], dtype=torch.float32)
        result = []
        for obj in objects:
            if obj.mask is not None:
                mask = torch.as_tensor(obj.mask, dtype=torch.bool)
                pixels = image.detach().float().cpu()[:, mask]
            else:
                pixels = object_crop(image.detach().float().cpu(), obj).flatten(1)
            mean = pixels.mean(dim=1)
            result.append(names[int(torch.argmin(((table - mean) ** 2).sum(dim=1)))])
        return result


# -- transformers models --------------------------------------------------------------------
@dataclass(kw_only=True)
class CLIPColourClassifier:
    """GenEval's colour classifier on a transformers ``CLIPModel``. ``model``: folder or hub
    id (the evaluator's open_clip ViT-L-14 ``openai`` weights are ``openai/clip-vit-large-patch14``
    here); ``processor``: tokenizer and ``preprocessor_config.json`` (default ``model``).
    ``device`` / ``dtype``: where and in which precision CLIP runs; ``batch_size``: object
    crops per CLIP forward."""

    model: str = "openai/clip-vit-large-patch14"
    processor: str | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    batch_size: int = 16
    _bundle: Any = field(init=False, repr=False, default=None)
    _classifiers: dict[str, Tensor] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.dtype = canonical_precision(self.dtype, "CLIPColourClassifier.dtype")
        require(self.batch_size >= 1, "CLIPColourClassifier.batch_size must be >= 1")

    def _load(self) -> CLIPBundle:
        if self._bundle is None:
            from unirl.reward.local.clip_score import load_clip

            self._bundle = load_clip(
                owner="CLIPColourClassifier",
                model=self.model,
                processor=self.processor,
                dtype=parse_dtype(self.dtype, "CLIPColourClassifier.dtype"),
                device=torch.device(self.device),
                resize="shortest_crop",
            )
        return self._bundle

    def colour_embeddings(self, classname: str) -> Tensor:
        """``[len(COLORS), D]``: per colour the normalised mean of its normalised templates."""
        if classname not in self._classifiers:
            from unirl.reward.local.clip_score import clip_text_embeds

            bundle = self._load()
            rows = []
            with torch.no_grad():
                for colour in COLORS:
                    texts = [t.format(c=colour, classname=classname) for t in COLOUR_TEMPLATES]
                    rows.append(F.normalize(clip_text_embeds(bundle, texts).mean(dim=0), dim=-1))
            self._classifiers[classname] = torch.stack(rows)
        return self._classifiers[classname]

    def classify(self, image: Tensor, objects: list[Detection], classname: str) -> list[str]:
        if not objects:
            return []
        bundle = self._load()
        text = self.colour_embeddings(classname)
        device = torch.device(self.device)
        result: list[str] = []
        with torch.no_grad():
            for start in range(0, len(objects), self.batch_size):
                crops = [
                    bundle.preprocess(object_crop(image.to(device).float(), obj)[None])
                    for obj in objects[start : start + self.batch_size]
                ]
                clip = bundle.model
                pooled = clip.vision_model(pixel_values=torch.cat(crops).to(clip.dtype))
                embeds = F.normalize(clip.visual_projection(pooled.pooler_output).float(), dim=-1)
                result += [COLORS[int(i)] for i in (embeds @ text.T.to(device)).argmax(dim=1)]
        return result


@dataclass(kw_only=True)
class Mask2FormerDetector:
    """COCO instance segmentation with a transformers Mask2Former. ``model``: folder or hub id
    (default ``facebook/mask2former-swin-small-coco-instance``, the evaluator's architecture;
    see docs/rewards.md for how it differs from the mmdet checkpoint); ``class_names``: names
    by label id (default: the config's ``id2label``). Images are resized like mmdet's test
    pipeline (scale to fit ``short_side`` x ``long_side`` keeping the ratio, bilinear),
    normalised with ImageNet mean / std on 0-255 values and zero-padded to ``size_divisor``.
    ``device`` / ``dtype``: where and in which precision the detector runs;
    ``max_per_image``: detections kept per image after post-processing (mmdet's ``max_per_img``)."""

    model: str = "facebook/mask2former-swin-small-coco-instance"
    class_names: list[str] | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    short_side: int = 800
    long_side: int = 1333
    size_divisor: int = 32
    max_per_image: int = 100
    _model: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.dtype = canonical_precision(self.dtype, "Mask2FormerDetector.dtype")
        require(
            self.short_side >= 1 and self.long_side >= self.short_side,
            "Mask2FormerDetector: give 1 <= short_side <= long_side",
        )
        require(self.max_per_image >= 1, "Mask2FormerDetector.max_per_image must be >= 1")

    def _load(self) -> Mask2FormerForUniversalSegmentation:
        if self._model is None:
            from transformers import Mask2FormerForUniversalSegmentation

            from unirl.reward.local._hf import load_pretrained

            net = load_pretrained(
                Mask2FormerForUniversalSegmentation.from_pretrained,
                self.model,
                owner="Mask2FormerDetector",
                field_name="model",
                dtype=parse_dtype(self.dtype, "Mask2FormerDetector.dtype"),
            )
            self._model = net.to(torch.device(self.device)).eval()  # type: ignore[arg-type]  # transformers' _Wrapped.to
            if self.class_names is None:
                id2label = self._model.config.id2label
                self.class_names = [id2label[i] for i in range(len(id2label))]
            num = int(self._model.config.num_labels)
            require(
                len(self.class_names) == num,
                f"Mask2FormerDetector.class_names has {len(self.class_names)} names; the model "
                f"predicts {num} classes",
            )
        return self._model

    def prepare(self, image: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """``pixels[1, 3, Hp, Wp]`` (resized, normalised, padded) and the resized size."""
        height, width = image.shape[-2:]
        scale = min(self.short_side / min(height, width), self.long_side / max(height, width))
        size = (int(height * scale + 0.5), int(width * scale + 0.5))
        x = image[None].float().clamp(0, 1) * 255.0
        x = torch.round(x)  # the evaluator reads 8-bit images
        if size != (height, width):
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        x = (x - mean) / std
        div = self.size_divisor
        pad_h, pad_w = (-size[0]) % div, (-size[1]) % div
        return F.pad(x, (0, pad_w, 0, pad_h)), size

    def postprocess(
        self, class_logits: Tensor, mask_logits: Tensor, resized: tuple[int, int], out_size: tuple
    ) -> list[Detection]:
        """mmdet's instance post-processing of one image: ``class_logits[Q, C + 1]``,
        ``mask_logits[Q, h, w]`` at a quarter of the padded input."""
        assert self.class_names is not None
        padded = (mask_logits.shape[-2] * 4, mask_logits.shape[-1] * 4)
        masks = F.interpolate(mask_logits[None].float(), size=padded, mode="bilinear")
        masks = masks[..., : resized[0], : resized[1]]
        masks = F.interpolate(masks, size=tuple(out_size), mode="bilinear")[0]
        num_classes = class_logits.shape[1] - 1
        scores = class_logits.float().softmax(dim=-1)[:, :-1].flatten()
        top = min(self.max_per_image, scores.numel())
        top_scores, top_index = scores.topk(top, sorted=False)
        labels = top_index % num_classes
        queries = top_index // num_classes
        chosen = masks[queries]
        binary = chosen > 0
        mask_score = (chosen.sigmoid() * binary).flatten(1).sum(1) / (
            binary.flatten(1).sum(1) + 1e-6
        )
        det_scores = top_scores * mask_score
        return [
            Detection(
                self.class_names[int(labels[i])],
                mask_to_box(binary[i]),
                float(det_scores[i]),
                binary[i].cpu().numpy(),
            )
            for i in range(top)
        ]

    def detect(self, images: Tensor) -> list[list[Detection]]:
        net = self._load()
        out = []
        with torch.no_grad():
            for image in images:
                pixels, resized = self.prepare(image.to(torch.device(self.device)))
                result = net(pixel_values=pixels.to(net.dtype))
                out.append(
                    self.postprocess(
                        result.class_queries_logits[0],
                        result.masks_queries_logits[0],
                        resized,
                        tuple(image.shape[-2:]),
                    )
                )
        return out
