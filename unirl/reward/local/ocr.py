"""OCR reward: Flow-GRPO's normalised-Levenshtein score of the quoted target text."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import (
    RewardBackend,
    RewardError,
    ScoreResult,
    as_scores,
    check_images,
    check_lengths,
    images_to_uint8,
)

# rapidocr-onnxruntime 1.4.4, its last release, requires Python < 3.13; the [ocr] and [dev]
# extras skip it there (an environment marker), so its absence there is expected, not a bug
RAPIDOCR_LAST_PYTHON = (3, 12)


def rapidocr_missing_message(version: tuple[int, int] | None = None) -> str:
    """One line: why rapidocr-onnxruntime is missing on this Python and what to do."""
    major, minor = version or sys.version_info[:2]
    if (major, minor) > RAPIDOCR_LAST_PYTHON:
        return (
            f"OCRScorer(engine='rapidocr') needs rapidocr-onnxruntime, which has no release for "
            f"Python {major}.{minor} (1.4.4 requires Python < 3.13), so the [ocr] extra of "
            "unirl-mm installs nothing here: run the OCR reward on Python 3.11 or 3.12 "
            "(pip install 'unirl-mm[ocr]' there), or use engine=easyocr (pip install 'unirl-mm[eval]')"
        )
    return (
        "OCRScorer(engine='rapidocr') needs rapidocr-onnxruntime: pip install 'unirl-mm[ocr]' "
        "(the extra of this repository's distribution unirl-mm; 'unirl' on the public index "
        "is another project)"
    )


def extract_quoted_target(prompt: str) -> str | None:
    """The text between the first pair of ASCII double quotes, or ``None`` if there is none."""
    start = prompt.find('"')
    if start < 0:
        return None
    end = prompt.find('"', start + 1)
    if end < 0:
        return None
    return prompt[start + 1 : end]


def normalize_ocr_text(text: str) -> str:
    """Lower-case and remove spaces (Flow-GRPO's normalisation for both sides)."""
    return text.replace(" ", "").lower()


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert / delete / substitute, unit costs) between ``a`` and ``b``."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def ocr_score(recognized: str, target: str) -> float:
    """``1 - d / len(target)`` with both sides normalised (see docs/math.md, OCR reward).

    ``d = 0`` if the target is a substring of the recognised text, else
    ``min(levenshtein(recognized, target), len(target))``. Returns a value in [0, 1].
    """
    recognized = normalize_ocr_text(recognized)
    target = normalize_ocr_text(target)
    if not target:
        raise ValueError("OCR target text is empty after removing spaces")
    if target in recognized:
        return 1.0
    distance = min(levenshtein(recognized, target), len(target))
    return 1.0 - distance / len(target)


@dataclass(kw_only=True)
class OCRScorer(RewardBackend):
    """Reads each image with an OCR engine and scores it against the prompt's quoted text.

    The target is ``metadata[target_key]`` when present, else the text between the first
    pair of double quotes in the prompt; a sample with neither raises (a dataset bug).
    Recognised lines are concatenated. An engine exception scores ``0.0``, is reported in
    ``ScoreResult.errors`` and counted as ``<name>/failures``. Runs one image at a time
    on CPU (rapidocr) or on ``device`` (easyocr). ``engine``: ``rapidocr`` (ONNX, bundled
    weights) or ``easyocr``; ``easyocr_model_dir``: the folder holding easyocr's weights
    (required with ``easyocr``, which would otherwise download them); ``target_key``: the
    metadata key of the target text (else the prompt's first quoted text).
    """

    engine: Literal["rapidocr", "easyocr"] = "rapidocr"
    easyocr_model_dir: str | None = None
    name: str = "ocr"
    target_key: str = "target_text"
    _reader: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        require(
            self.engine in ("rapidocr", "easyocr"),
            f"OCRScorer.engine={self.engine!r}: use 'rapidocr' or 'easyocr'",
        )
        if self.engine == "easyocr":
            require(
                self.easyocr_model_dir is not None,
                "OCRScorer.engine=easyocr needs easyocr_model_dir: easyocr downloads its weights "
                "from GitHub and fails offline; point it at a folder holding craft_mlt_25k.pth "
                "and english_g2.pth, or use engine=rapidocr",
            )
            require(
                os.path.isdir(str(self.easyocr_model_dir)),
                f"OCRScorer.easyocr_model_dir={self.easyocr_model_dir!r} is not a directory",
            )
        require(bool(self.name), "OCRScorer.name must be a non-empty component name")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def targets(self, prompts: list[str], metadata: list[dict]) -> list[str]:
        """The target text of each sample; raises :class:`RewardError` naming a bad sample."""
        out = []
        for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
            target = meta.get(self.target_key) if meta else None
            if target is None:
                target = extract_quoted_target(prompt)
            if target is None or not normalize_ocr_text(str(target)):
                raise RewardError(
                    f"OCRScorer: sample {i} has no target text: prompt {prompt!r} has no "
                    f'non-empty text between double quotes and metadata has no "{self.target_key}" '
                    "(fix the prompt file)"
                )
            out.append(str(target))
        return out

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "OCRScorer", metadata=metadata)
        images = check_images(images, n, "OCRScorer")
        targets = self.targets(prompts, metadata)
        self._load()  # a missing engine is a setup error, not a per-sample failure
        pixels = images_to_uint8(images)
        values: list[float] = []
        errors: list[str | None] = []
        for i in range(n):
            try:
                recognized = self.read_text(pixels[i])
            except Exception as exc:
                values.append(0.0)
                errors.append(f"{self.engine} failed: {type(exc).__name__}: {exc}")
                continue
            values.append(ocr_score(recognized, targets[i]))
            errors.append(None)
        failures = sum(e is not None for e in errors)
        return ScoreResult(
            scores={self.name: as_scores(values)},
            errors={self.name: errors},
            metrics={f"{self.name}/failures": float(failures)},
        )

    def read_text(self, image: np.ndarray) -> str:
        """All recognised lines of one ``uint8[H, W, 3]`` RGB image, concatenated."""
        reader = self._load()
        if self.engine == "rapidocr":
            # rapidocr treats a 3-channel ndarray as OpenCV BGR.
            result, _ = reader(np.ascontiguousarray(image[..., ::-1]), use_cls=False)
            return "".join(str(line[1]) for line in result or [])
        lines = reader.readtext(image, detail=0)
        return "".join(str(line) for line in lines)

    def _load(self) -> Any:
        if self._reader is not None:
            return self._reader
        if self.engine == "rapidocr":
            try:
                from rapidocr_onnxruntime import RapidOCR
            except ImportError as exc:
                raise ImportError(rapidocr_missing_message()) from exc
            self._reader = RapidOCR()
        else:
            try:
                import easyocr
            except ImportError as exc:
                raise ImportError(
                    "OCRScorer(engine='easyocr') needs easyocr: pip install 'unirl-mm[eval]'"
                ) from exc
            self._reader = easyocr.Reader(
                ["en"],
                gpu=self.device.type == "cuda",
                model_storage_directory=str(self.easyocr_model_dir),
                download_enabled=False,
                verbose=False,
            )
        return self._reader

    def to(self, device: torch.device | str) -> OCRScorer:
        before = self.device
        super().to(device)
        if self.engine == "easyocr" and self.device != before:
            self._reader = None
        return self

    def offload(self) -> None:
        """Drop the easyocr reader (frees GPU memory); rapidocr runs on CPU and is kept."""
        if self.engine == "easyocr":
            self._reader = None
