"""The reward backend contract: batched, device-aware scorers that return named components."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from unirl.config import ConfigError, require


class RewardError(RuntimeError):
    """A reward is missing or non-finite; the message names the component and the sample."""


@dataclass
class ScoreResult:
    """What a backend returns for ``N`` samples.

    ``scores``: component name -> ``Tensor[N]`` float32 on CPU; NaN marks a failed sample.
    ``errors``: component name -> ``list[str | None]`` of length ``N`` (why a sample failed).
    ``total``: ``Tensor[N]`` combined reward, set only by combining backends
    (:class:`~unirl.reward.WeightedRewardBackend`); ``None`` means "the single component".
    ``metrics``: scalar counters such as ``ocr/failures``.
    """

    scores: dict[str, Tensor]
    errors: dict[str, list[str | None]] = field(default_factory=dict)
    total: Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def check(self, names: tuple[str, ...], n: int, source: str) -> None:
        """Raise :class:`RewardError` unless every name in ``names`` has a ``Tensor[n]``."""
        for name in names:
            if name not in self.scores:
                raise RewardError(
                    f"{source} declared reward component '{name}' but returned none "
                    f"(got {sorted(self.scores)})"
                )
            value = self.scores[name]
            if not isinstance(value, Tensor) or tuple(value.shape) != (n,):
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise RewardError(
                    f"{source} returned reward component '{name}' with shape {shape}; "
                    f"expected ({n},), one score per sample"
                )
            errors = self.errors.get(name)
            if errors is not None and len(errors) != n:
                raise RewardError(
                    f"{source} returned {len(errors)} error entries for '{name}'; expected {n}"
                )
        if self.total is not None and tuple(self.total.shape) != (n,):
            raise RewardError(
                f"{source} returned a total reward of shape {tuple(self.total.shape)}; "
                f"expected ({n},)"
            )


class RewardBackend(ABC):
    """A batched scorer producing one or more named reward components.

    Subclasses are ``@dataclass(kw_only=True)`` configs instantiable by Hydra ``_target_``.
    ``score`` receives ``images[N, 3, H, W]`` float in [0, 1] (or ``None`` for scorers that
    need only text), ``prompts`` (``N`` strings) and ``metadata`` (``N`` dicts), and returns a
    :class:`ScoreResult` whose tensors live on CPU. Text tracks go through ``score_texts``.
    ``name`` (on the backends that produce one component): that component's name, the key of
    its score in the ``ScoreResult`` and of its metrics (``reward/<name>/mean`` as the
    service's backend; inside a ``WeightedRewardBackend`` the component's key is used).
    """

    produces_total: ClassVar[bool] = False
    """True for backends that fill ``ScoreResult.total`` (combine several components)."""

    @property
    @abstractmethod
    def names(self) -> tuple[str, ...]:
        """Component names this backend produces, in a fixed order."""

    @abstractmethod
    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        """Score ``N`` generated images. Returns a :class:`ScoreResult` of ``Tensor[N]``."""

    def score_texts(
        self, texts: list[str], prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        """Score ``N`` generated texts (AR tracks). Image scorers do not implement this."""
        raise TypeError(
            f"{type(self).__name__} scores images, but the track decoded texts; "
            "use a text reward (ExactMatch, BoxedMathAnswer, MultipleChoice) for AR tracks"
        )

    def score_edit(
        self,
        images: Tensor,
        sources: Tensor,
        prompts: list[str],
        metadata: list[dict],
    ) -> ScoreResult:
        """Score ``N`` edits: ``images[N, 3, H, W]`` are the results, ``sources[N, 3, H, W]``
        the images they were edited from (both float in [0, 1]); ``prompts`` are the edit
        instructions. A scorer of the result alone (aesthetics, OCR) ignores the sources;
        edit rewards (:class:`EditRewardBackend`) compare the two."""
        return self.score(images, prompts, metadata)

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        """Score ``N`` videos ``frames[N, T, 3, H, W]`` in [0, 1] at ``fps``. Video scorers
        implement this; an image scorer is refused rather than guessed at: wrap it in
        :class:`unirl.reward.local.PerFrame` with the aggregation you mean."""
        raise RewardError(
            f"{type(self).__name__} scores images, but the track decoded videos; wrap it as "
            "{_target_: unirl.reward.local.PerFrame, aggregate: mean, scorer: {...}} to score "
            "each frame and aggregate over time"
        )

    @property
    def device(self) -> torch.device:
        """Where the scorer computes (models live here); results still come back on CPU."""
        return getattr(self, "_device", torch.device("cpu"))

    def to(self, device: torch.device | str) -> RewardBackend:
        """Move weights (if any) to ``device``; scorers without weights only record it."""
        self._device = torch.device(device)
        return self

    def offload(self) -> None:
        """Free accelerator memory between reward calls (no-op for weightless scorers)."""
        return None

    def onload(self) -> None:
        """Undo :meth:`offload` before the next reward call (no-op for weightless scorers)."""
        return None


class TextRewardBackend(RewardBackend):
    """A scorer of generated texts (AR tracks); implement :meth:`score_texts`."""

    @abstractmethod
    def score_texts(
        self, texts: list[str], prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        """Score ``N`` texts against ``metadata`` answers. Returns ``Tensor[N]`` components."""

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        raise TypeError(
            f"{type(self).__name__} scores generated texts, but the track decoded images; "
            "use an image reward for diffusion tracks"
        )


def as_backend(value: object, where: str) -> RewardBackend:
    """``value`` as a :class:`RewardBackend`, undoing Hydra's container conversion.

    Under Hydra's default ``_convert_: none``, a backend instantiated inside a dict or list
    block (``components``, ``guards``) is turned back into an OmegaConf node of its dataclass
    type; ``OmegaConf.to_object`` rebuilds the instance. Anything else raises ``ConfigError``.
    """
    if isinstance(value, RewardBackend):
        return value
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        node_type = OmegaConf.get_type(value)
        if isinstance(node_type, type) and issubclass(node_type, RewardBackend):
            return OmegaConf.to_object(value)  # type: ignore[return-value]
    raise ConfigError(
        f"{where} is {type(value).__name__}; give a RewardBackend (a block with _target_, "
        "e.g. unirl.reward.local.OCRScorer)"
    )


def check_images(images: Tensor | None, n: int, source: str) -> Tensor:
    """Validate ``images[N, 3, H, W]`` floating point; returns it unchanged."""
    if images is None:
        raise RewardError(f"{source} needs images, but the track carries none")
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[0] != n:
        raise RewardError(
            f"{source} expects images of shape [N={n}, 3, H, W]; got {tuple(images.shape)}"
        )
    if not images.is_floating_point():
        raise RewardError(f"{source} expects float images in [0, 1]; got dtype {images.dtype}")
    return images


def check_videos(frames: Tensor | None, n: int, source: str) -> Tensor:
    """Validate ``frames[N, T, 3, H, W]`` floating point; returns it unchanged."""
    if frames is None or frames.ndim != 5 or frames.shape[2] != 3 or frames.shape[0] != n:
        got = None if frames is None else tuple(frames.shape)
        raise RewardError(f"{source} expects videos of shape [N={n}, T, 3, H, W]; got {got}")
    if not frames.is_floating_point():
        raise RewardError(f"{source} expects float frames in [0, 1]; got dtype {frames.dtype}")
    return frames


def check_video_call(
    frames: Tensor | None,
    prompts: list[str],
    metadata: list[dict],
    source: str,
    fps: float | None = None,
) -> Tensor:
    """A ``score_video`` call's inputs: one metadata row per prompt, ``frames[N, T, 3, H, W]``
    floating point (:func:`check_videos`), and, given, a positive ``fps`` (a scorer that
    samples frames by time); returns the frames."""
    n = len(prompts)
    check_lengths(n, source, metadata=metadata)
    frames = check_videos(frames, n, source)
    if fps is not None:
        require(fps > 0, f"{source}: fps={fps} must be > 0")
    return frames


def check_lengths(n: int, source: str, **lists: list) -> None:
    """Raise :class:`RewardError` unless every list has ``n`` entries."""
    for key, values in lists.items():
        if len(values) != n:
            raise RewardError(f"{source}: got {len(values)} {key} for {n} samples")


def images_to_uint8(images: Tensor) -> np.ndarray:
    """``images[N, 3, H, W]`` float in [0, 1] -> ``uint8[N, H, W, 3]`` RGB numpy (rounded)."""
    pixels = images.detach().float().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).contiguous().cpu().numpy()


def as_scores(values: list[float] | Tensor) -> Tensor:
    """A ``Tensor[N]`` float32 on CPU from a list of floats or a tensor."""
    if isinstance(values, Tensor):
        return values.detach().to(device="cpu", dtype=torch.float32).reshape(-1)
    return torch.tensor(
        [float(v) if v is not None else math.nan for v in values], dtype=torch.float32
    )


class EditRewardBackend(RewardBackend):
    """A scorer of edits: it sees the result and the source (:meth:`score_edit`); it cannot
    score an image without its source, so a recipe pairing it with a prompt file without
    reference images is refused before Ray (``needs_references``)."""

    needs_references: ClassVar[bool] = True

    @abstractmethod
    def score_edit(
        self,
        images: Tensor,
        sources: Tensor,
        prompts: list[str],
        metadata: list[dict],
    ) -> ScoreResult:
        """Score ``N`` results against their sources. Returns ``Tensor[N]`` components."""

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        raise RewardError(
            f"{type(self).__name__} scores edits against their source images, but the track "
            "carries none; train on an editing prompt file (every line with a reference image)"
        )
