"""GenEval (Ghosh et al., 2023): compositional text-to-image checks (single object, two
objects, counting, colours, position, colour attribution) as a reward and an evaluation.
``rules`` is the detector-agnostic rule layer, ``detectors`` the transformers detector and
colour classifier plus cheap deterministic stand-ins, ``prompts`` the prompt-set generator,
``python -m unirl.reward.local.geneval`` the per-task table of a folder of images."""

from __future__ import annotations

from unirl.reward.local.geneval.detectors import (
    CLIPColourClassifier,
    ColourBlobDetector,
    Mask2FormerDetector,
    MeanColourClassifier,
    connected_components,
    mask_to_box,
    object_crop,
)
from unirl.reward.local.geneval.prompts import COCO_CLASSES, TASK_SIZES, make_prompt_set, plural
from unirl.reward.local.geneval.rules import (
    COLORS,
    TASKS,
    Detection,
    GenEvalRules,
    RuleResult,
    box_iou,
    evaluate_clauses,
    format_table,
    relative_position,
    select_detections,
    task_table,
)
from unirl.reward.local.geneval.scorer import GenEval

__all__ = [
    "COCO_CLASSES",
    "COLORS",
    "TASKS",
    "TASK_SIZES",
    "CLIPColourClassifier",
    "ColourBlobDetector",
    "Detection",
    "GenEval",
    "GenEvalRules",
    "Mask2FormerDetector",
    "MeanColourClassifier",
    "RuleResult",
    "box_iou",
    "connected_components",
    "evaluate_clauses",
    "format_table",
    "make_prompt_set",
    "mask_to_box",
    "object_crop",
    "plural",
    "relative_position",
    "select_detections",
    "task_table",
]
