"""Local reward scorers: OCR, JPEG (in)compressibility, image-statistic guards, quick-start
targets and rule-based text matchers."""

from __future__ import annotations

from unirl.reward.local.image_stats import ImageStats, color_entropy, dark_fraction, edge_density
from unirl.reward.local.jpeg import JpegCompressibility, JpegIncompressibility, jpeg_size_kb
from unirl.reward.local.ocr import (
    OCRScorer,
    extract_quoted_target,
    levenshtein,
    normalize_ocr_text,
    ocr_score,
)
from unirl.reward.local.targets import BrightnessTarget, ColorTarget
from unirl.reward.local.text_match import (
    BoxedMathAnswer,
    ExactMatch,
    MultipleChoice,
    extract_boxed,
    extract_choice,
    math_equal,
)

__all__ = [
    "BoxedMathAnswer",
    "BrightnessTarget",
    "ColorTarget",
    "ExactMatch",
    "ImageStats",
    "JpegCompressibility",
    "JpegIncompressibility",
    "MultipleChoice",
    "OCRScorer",
    "color_entropy",
    "dark_fraction",
    "edge_density",
    "extract_boxed",
    "extract_choice",
    "extract_quoted_target",
    "jpeg_size_kb",
    "levenshtein",
    "math_equal",
    "normalize_ocr_text",
    "ocr_score",
]
