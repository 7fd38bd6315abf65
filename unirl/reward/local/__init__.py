"""Local reward scorers: OCR, JPEG (in)compressibility, image-statistic guards, quick-start
targets, edit rewards (result vs source; EditJudge, a VLM judge of edits), rule-based text matchers and model-based scorers (CLIP score, PickScore, HPS v2,
ImageReward, LAION aesthetic; their weights load lazily on the first ``score``) and the VLM
rewards of ``vlm/`` (HPSv3, VideoAlign, EditReward, UnifiedReward, WISE judge)."""

from __future__ import annotations

from unirl.reward.local._hf import PretrainedScorer, RewardMLP, RewardWeightsNotFound
from unirl.reward.local.aesthetic import LaionAesthetic
from unirl.reward.local.clip_score import CLIPScore
from unirl.reward.local.edit import RegionColorTarget, SourcePreservation, edit_mask
from unirl.reward.local.edit_judge import EditJudge, RatingReader, judge_messages
from unirl.reward.local.hps import (
    HPSv2,
    convert_open_clip_checkpoint,
    convert_open_clip_state_dict,
)
from unirl.reward.local.image_reward import (
    ImageReward,
    convert_image_reward_checkpoint,
    convert_image_reward_state_dict,
    image_reward_blip_config,
)
from unirl.reward.local.image_stats import ImageStats, color_entropy, dark_fraction, edge_density
from unirl.reward.local.jpeg import JpegCompressibility, JpegIncompressibility, jpeg_size_kb
from unirl.reward.local.length_reward import OverlongPenalty, overlong_penalty
from unirl.reward.local.ocr import (
    OCRScorer,
    extract_quoted_target,
    levenshtein,
    normalize_ocr_text,
    ocr_score,
)
from unirl.reward.local.pickscore import PickScore
from unirl.reward.local.targets import BrightnessTarget, ColorTarget
from unirl.reward.local.text_match import (
    BoxedMathAnswer,
    ExactMatch,
    MultipleChoice,
    extract_boxed,
    extract_choice,
    math_equal,
)
from unirl.reward.local.video import PerFrame, TemporalConsistency, VideoPickScore
from unirl.reward.local.vlm import EditReward, HPSv3, UnifiedReward, VideoAlign, WISEJudge

__all__ = [
    "BoxedMathAnswer",
    "BrightnessTarget",
    "CLIPScore",
    "ColorTarget",
    "EditJudge",
    "EditReward",
    "ExactMatch",
    "HPSv2",
    "HPSv3",
    "ImageReward",
    "ImageStats",
    "JpegCompressibility",
    "JpegIncompressibility",
    "LaionAesthetic",
    "MultipleChoice",
    "OCRScorer",
    "OverlongPenalty",
    "PerFrame",
    "PickScore",
    "PretrainedScorer",
    "RatingReader",
    "RegionColorTarget",
    "RewardMLP",
    "RewardWeightsNotFound",
    "SourcePreservation",
    "TemporalConsistency",
    "UnifiedReward",
    "VideoAlign",
    "VideoPickScore",
    "WISEJudge",
    "color_entropy",
    "convert_image_reward_checkpoint",
    "convert_image_reward_state_dict",
    "convert_open_clip_checkpoint",
    "convert_open_clip_state_dict",
    "dark_fraction",
    "edge_density",
    "edit_mask",
    "extract_boxed",
    "extract_choice",
    "extract_quoted_target",
    "image_reward_blip_config",
    "jpeg_size_kb",
    "judge_messages",
    "levenshtein",
    "math_equal",
    "normalize_ocr_text",
    "ocr_score",
    "overlong_penalty",
]
