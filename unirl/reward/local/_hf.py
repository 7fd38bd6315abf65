"""Shared plumbing of the model-based scorers (CLIP score, PickScore, HPS v2, ImageReward,
LAION aesthetic): where weights come from (a local folder or the hub), torch image
preprocessing, the released linear reward head, and :class:`PretrainedScorer`, the lazy,
batched, device-aware base class."""

from __future__ import annotations

import json
import os
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unirl.config import require
from unirl.config.precision import canonical_precision, parse_dtype
from unirl.reward.base import RewardBackend, ScoreResult, check_images, check_lengths

T = TypeVar("T")

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

ResizeMode = Literal["shortest_crop", "longest_pad"]
Triple = tuple[float, float, float]


class RewardWeightsNotFound(FileNotFoundError):
    """A scorer's weights are neither in a local folder nor reachable on the hub."""


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to a true value."""
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(key, "").strip().lower() in ("1", "true", "yes", "on"):
            return True
    return False


def _looks_like_path(value: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else is meant as a filesystem path."""
    return (
        value.startswith(("/", "./", "../", "~", "."))
        or value.count("/") > 1
        or "\\" in value
        or value.endswith((".pt", ".pth", ".bin", ".safetensors", ".json"))
    )


@dataclass(frozen=True)
class WeightSource:
    """Where ``from_pretrained`` should look: ``location`` (a folder or a hub id)."""

    location: str
    is_local: bool
    local_files_only: bool


def _fix_hint(field_name: str) -> str:
    return (
        f"set {field_name}=/path/to/local/folder (a save_pretrained folder: config.json, weights, "
        "tokenizer and preprocessor files), or make the hub reachable (unset HF_HUB_OFFLINE and "
        "check the network)"
    )


def resolve_weights(value: str, *, owner: str, field_name: str) -> WeightSource:
    """A local folder (``local_files_only=True``) or a hub id (offline iff ``HF_HUB_OFFLINE``).

    Raises :class:`RewardWeightsNotFound` for a path that does not exist or is a file.
    """
    expanded = os.path.expanduser(str(value))
    if os.path.isdir(expanded):
        return WeightSource(expanded, is_local=True, local_files_only=True)
    if os.path.isfile(expanded):
        raise RewardWeightsNotFound(
            f"{owner}.{field_name}={value!r} is a file; expected a folder saved by "
            "save_pretrained (see unirl/reward/README.md for the conversion helpers)"
        )
    if _looks_like_path(str(value)):
        raise RewardWeightsNotFound(
            f"{owner}.{field_name}={value!r}: no such folder; {_fix_hint(field_name)}"
        )
    return WeightSource(str(value), is_local=False, local_files_only=hub_offline())


def load_pretrained(
    loader: Callable[..., T], value: str, *, owner: str, field_name: str, **kwargs: object
) -> T:
    """``loader(location, local_files_only=..., **kwargs)`` with a clear error when unreachable."""
    source = resolve_weights(value, owner=owner, field_name=field_name)
    try:
        return loader(source.location, local_files_only=source.local_files_only, **kwargs)
    except OSError as exc:
        if source.is_local:
            reason = f"the folder {source.location!r} is incomplete"
        elif source.local_files_only:
            reason = "HF_HUB_OFFLINE=1 and it is not in the local Hugging Face cache"
        else:
            reason = "it is not a local folder and the hub is unreachable"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise RewardWeightsNotFound(
            f"{owner}: cannot load {field_name}={value!r}: {reason}; {_fix_hint(field_name)} "
            f"[{type(exc).__name__}: {first_line}]"
        ) from exc


def pretrained_file(value: str, filename: str, *, owner: str, field_name: str) -> str | None:
    """Path of ``filename`` inside the folder or hub repo ``value``; ``None`` if it has none."""
    source = resolve_weights(value, owner=owner, field_name=field_name)
    if source.is_local:
        path = os.path.join(source.location, filename)
        return path if os.path.isfile(path) else None
    from transformers.utils import cached_file

    return cached_file(
        source.location,
        filename,
        local_files_only=source.local_files_only,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )


def read_pretrained_json(value: str, filename: str, *, owner: str, field_name: str) -> dict | None:
    """The parsed ``filename`` of a folder / hub repo, or ``None`` when it has none."""
    path = pretrained_file(value, filename, owner=owner, field_name=field_name)
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_state_dict_file(path: str, *, owner: str, field_name: str) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` / ``.pt`` / ``.pth`` file (a ``"state_dict"`` entry is
    unwrapped); raises :class:`RewardWeightsNotFound` when the file does not exist."""
    expanded = os.path.expanduser(str(path))
    if not os.path.isfile(expanded):
        raise RewardWeightsNotFound(
            f"{owner}.{field_name}={path!r}: no such file; set {field_name}=/path/to/weights "
            "(.safetensors, .pt or .pth)"
        )
    if expanded.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(expanded, device="cpu")
    state = torch.load(expanded, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    require(
        isinstance(state, dict) and all(isinstance(v, Tensor) for v in state.values()),
        f"{owner}.{field_name}={path!r} does not hold a state dict of tensors",
    )
    return dict(state)


class RewardMLP(nn.Module):
    """The released linear reward head of ImageReward and the LAION improved aesthetic
    predictor: ``input -> 1024 -> 128 -> 64 -> 16 -> 1`` Linear layers with dropout
    0.2 / 0.2 / 0.1 after the first three and **no** activation between them (as released).
    Parameter names ``layers.{0,2,4,6,7}.{weight,bias}`` match the released state dicts.
    Returns ``score[B]`` for ``features[B, input_size]``.
    """

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, features: Tensor) -> Tensor:
        return self.layers(features).squeeze(-1)


def load_reward_mlp(
    state: dict[str, Tensor], input_size: int, *, owner: str, where: str
) -> RewardMLP:
    """A :class:`RewardMLP` in eval mode with ``state`` loaded strictly (fp32, CPU)."""
    head = RewardMLP(input_size)
    try:
        head.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(
            f"{owner}: {where} does not match the reward head (Linear {input_size}->1024->128->64"
            f"->16->1, keys layers.{{0,2,4,6,7}}.weight/bias): {exc}"
        ) from exc
    return head.eval()


def _square(value: object, key: str) -> int:
    """An int from a processor-config size entry (int, or a dict with one of the usual keys)."""
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        for name in (key, "shortest_edge", "height"):
            if name in value:
                return int(value[name])
    raise ValueError(f"unsupported image size entry {value!r}")


@dataclass(frozen=True)
class ImagePreprocess:
    """Torch version of the CLIP / open_clip eval transforms on ``images[N, 3, H, W]`` in [0, 1].

    ``shortest_crop`` (CLIPImageProcessor, torchvision ``Resize`` + ``CenterCrop``): resize so
    the shorter side is ``resize_size`` (the longer ``int(resize_size * long / short)``),
    bicubic with antialias, clamp to [0, 1], crop ``crop_size`` from the centre (offset
    ``(dim - crop_size) // 2``). ``longest_pad`` (open_clip ``ResizeMaxSize``, HPS v2): resize
    so the longer side is ``crop_size`` (the shorter ``round(short * scale)``), then pad with
    0 (black) to a square, left/top getting ``pad // 2``. Sizes already right are not resampled.
    Then ``(x - mean) / std``. Returns ``pixels[N, 3, crop_size, crop_size]`` float32.
    """

    crop_size: int
    resize_size: int
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD
    mode: ResizeMode = "shortest_crop"

    @classmethod
    def from_processor_config(cls, config: dict, *, mode: ResizeMode) -> ImagePreprocess:
        """From a ``preprocessor_config.json`` dict (``size``, ``crop_size``, mean and std)."""
        crop = _square(config.get("crop_size", config.get("size")), "height")
        resize = _square(config.get("size", crop), "shortest_edge")
        return cls(
            crop_size=crop,
            resize_size=resize,
            mean=cast(Triple, tuple(float(v) for v in config.get("image_mean", OPENAI_CLIP_MEAN))),
            std=cast(Triple, tuple(float(v) for v in config.get("image_std", OPENAI_CLIP_STD))),
            mode=mode,
        )

    def __call__(self, images: Tensor) -> Tensor:
        x = images.to(torch.float32).clamp(0.0, 1.0)
        height, width = x.shape[-2:]
        if self.mode == "shortest_crop":
            short, long = (height, width) if height <= width else (width, height)
            new_short, new_long = self.resize_size, int(self.resize_size * long / short)
            size = (new_short, new_long) if height <= width else (new_long, new_short)
            x = self._resize(x, size)
            top = (size[0] - self.crop_size) // 2
            left = (size[1] - self.crop_size) // 2
            require(
                top >= 0 and left >= 0,
                f"ImagePreprocess: resize_size={self.resize_size} < crop_size={self.crop_size}",
            )
            x = x[..., top : top + self.crop_size, left : left + self.crop_size]
        else:
            scale = self.crop_size / float(max(height, width))
            if scale != 1.0:
                size = (round(height * scale), round(width * scale))
                x = self._resize(x, size)
                pad_h, pad_w = self.crop_size - size[0], self.crop_size - size[1]
                x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @staticmethod
    def _resize(x: Tensor, size: tuple[int, int]) -> Tensor:
        if tuple(x.shape[-2:]) == tuple(size):
            return x
        out = F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True)
        return out.clamp(0.0, 1.0)


@dataclass(kw_only=True)
class PretrainedScorer(RewardBackend):
    """Base of the model-based scorers: lazy load, batching, dtype, device, offload.

    Weights load on the first :meth:`score` (so dry-runs and config composition never touch
    them). ``score`` splits the ``N`` samples into chunks of ``batch_size``, runs
    :meth:`_score_batch` under ``torch.no_grad`` on ``device`` and returns ``Tensor[N]``
    float32 on CPU; non-finite values are reported per sample in ``errors``. ``device`` is a
    string field here (``"cpu"``, ``"cuda:0"``); :attr:`torch_device` is the ``torch.device``.
    ``dtype``: the scorer's weight precision (``fp32``, ``bf16``, ``fp16``).
    """

    name: str
    # a string field over RewardBackend's torch.device property (see torch_device)
    device: str = "cpu"  # type: ignore[assignment]
    dtype: str = "fp32"
    batch_size: int = 16
    _loaded: bool = field(init=False, repr=False, default=False)
    _offloaded: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        require(bool(self.name), f"{owner}.name must be a non-empty component name")
        require(
            isinstance(self.batch_size, int) and self.batch_size >= 1,
            f"{owner}.batch_size={self.batch_size!r}: use a positive integer",
        )
        self.dtype = canonical_precision(self.dtype, f"{owner}.dtype")
        try:
            self.device = str(torch.device(self.device))
        except (RuntimeError, TypeError) as exc:
            require(False, f"{owner}.device={self.device!r} is not a torch device ({exc})")

    # -- hooks -----------------------------------------------------------------------------
    @abstractmethod
    def _load(self) -> None:
        """Load weights onto :attr:`torch_device` in :attr:`torch_dtype` (called once)."""

    @abstractmethod
    def _modules(self) -> list[nn.Module]:
        """The loaded modules that :meth:`to`, :meth:`offload` and :meth:`onload` move."""

    @abstractmethod
    def _score_batch(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Scores of one chunk: ``images[b, 3, H, W]`` on the device -> ``Tensor[b]``."""

    # -- contract --------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype, f"{type(self).__name__}.dtype")

    @property
    def loaded(self) -> bool:
        """Whether the weights have been loaded (they are only on the first ``score``)."""
        return self._loaded

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        owner = type(self).__name__
        n = len(prompts)
        check_lengths(n, owner, metadata=metadata)
        images = check_images(images, n, owner)
        self._ensure_ready()
        chunks: list[Tensor] = []
        with torch.no_grad():
            for start in range(0, n, self.batch_size):
                stop = min(start + self.batch_size, n)
                batch = images[start:stop].to(self.torch_device)
                values = self._score_batch(batch, list(prompts[start:stop]))
                chunks.append(values.detach().to(device="cpu", dtype=torch.float32).reshape(-1))
        scores = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.float32)
        finite = torch.isfinite(scores).tolist()
        errors: list[str | None] = [
            None if ok else f"{owner} returned a non-finite score (dtype={self.dtype})"
            for ok in finite
        ]
        return ScoreResult(
            scores={self.name: scores},
            errors={self.name: errors},
            metrics={f"{self.name}/nonfinite": float(n - sum(finite))},
        )

    def _ensure_ready(self) -> None:
        if not self._loaded:
            self._load()
            for module in self._modules():
                module.eval().requires_grad_(False)
            self._loaded = True
            self._offloaded = False
        elif self._offloaded:
            self.onload()

    def to(self, device: torch.device | str) -> PretrainedScorer:
        """Record ``device``; loaded (and not offloaded) modules move there at once."""
        self.device = str(torch.device(device))
        if self._loaded and not self._offloaded:
            self._move(self.torch_device)
        return self

    def offload(self) -> None:
        """Move loaded modules to CPU; the next :meth:`score` (or :meth:`onload`) brings them
        back to ``device``. A no-op before the first load."""
        if self._loaded and not self._offloaded:
            self._move(torch.device("cpu"))
            self._offloaded = True

    def onload(self) -> None:
        """Move loaded modules back to ``device`` (a no-op when not loaded or not offloaded)."""
        if self._loaded and self._offloaded:
            self._move(self.torch_device)
            self._offloaded = False

    def _move(self, device: torch.device) -> None:
        for module in self._modules():
            module.to(device)
        if device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()
