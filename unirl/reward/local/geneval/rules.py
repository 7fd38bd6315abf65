"""GenEval's rule layer: which detections count, and whether an image satisfies a prompt's
``include`` / ``exclude`` clauses. Detector-agnostic: it takes :class:`Detection` records
(label, box, score, mask), so tests feed a scene's ground truth here.

The rules follow the published evaluator (Ghosh et al., 2023, ``evaluation/evaluate_images.py``):

- keep a class's detections scoring ``> threshold`` (0.3; 0.9 for the ``counting`` tag),
  best first, at most ``max_objects`` (16), then greedy per-class NMS at ``nms_threshold``
  (1.0: off, the benchmark's setting) with IoU on inclusive pixel boxes (``x1 - x0 + 1``);
- ``include`` clauses combine with AND, ``exclude`` clauses with OR; an include clause takes
  its class's ``count`` best detections (fewer: wrong); with ``color``, at least ``count`` of
  them must be classified that colour; with ``position: [relation, k]``, every one of them
  must stand in ``relation`` to every object of the ``k``-th include clause (which must
  itself have matched); an exclude clause is violated when its class has ``>= count``
  detections (so "two clocks" is include 2 plus exclude 3);
- relative position: centre offset ``d = c_a - c_b``; each axis shrunk towards zero by
  ``margin · (w_a + w_b)`` (margin 0.1); no relation if both shrunk offsets are under 1e-3;
  otherwise, divided by ``|d|``, ``x < -0.5`` is "left of", ``x > 0.5`` "right of",
  ``y < -0.5`` "above", ``y > 0.5`` "below" (image y grows downwards).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from unirl.config import require

TASKS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""The six task tags, in the paper's column order."""

TASK_TITLES = {
    "single_object": "Single object",
    "two_object": "Two object",
    "counting": "Counting",
    "colors": "Colors",
    "position": "Position",
    "color_attr": "Color attribution",
}

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
"""The benchmark's colour vocabulary (the CLIP classifier chooses among exactly these)."""

RELATIONS = ("left of", "right of", "above", "below")


@dataclass(frozen=True)
class Detection:
    """One detected object: ``label`` (class name), ``box`` ``(x0, y0, x1, y1)`` in pixels,
    ``score`` in [0, 1], ``mask`` ``bool[H, W]`` or ``None`` (box-only detectors)."""

    label: str
    box: tuple[float, float, float, float]
    score: float
    mask: np.ndarray | None = None


@dataclass(kw_only=True)
class GenEvalRules:
    """The evaluator's thresholds. Defaults are the benchmark's: ``threshold`` 0.3 (detection
    score a detection must exceed), ``counting_threshold`` 0.9 (the same for ``counting``
    prompts), ``max_objects`` 16 per class, ``nms_threshold`` 1.0 (IoU at which a weaker box of
    the same class is dropped; 1.0 turns NMS off), ``position_margin`` 0.1 (fraction of the two
    objects' summed size subtracted from each axis of the centre offset)."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    nms_threshold: float = 1.0
    position_margin: float = 0.1

    def __post_init__(self) -> None:
        for name in ("threshold", "counting_threshold", "nms_threshold"):
            value = getattr(self, name)
            require(0.0 <= value <= 1.0, f"GenEvalRules.{name}={value}: give a value in [0, 1]")
        require(self.max_objects >= 1, "GenEvalRules.max_objects must be >= 1")
        require(self.position_margin >= 0.0, "GenEvalRules.position_margin must be >= 0")


def box_iou(box_a: Sequence[float], box_b: Sequence[float]) -> float:
    """IoU of two ``(x0, y0, x1, y1)`` boxes with the evaluator's inclusive pixel areas
    (``(x1 - x0 + 1) · (y1 - y0 + 1)``, clamped at 0)."""

    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area(
        (
            max(box_a[0], box_b[0]),
            max(box_a[1], box_b[1]),
            min(box_a[2], box_b[2]),
            min(box_a[3], box_b[3]),
        )
    )
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0.0


def select_detections(
    detections: Sequence[Detection], tag: str, rules: GenEvalRules
) -> dict[str, list[Detection]]:
    """Class name -> kept detections, best score first (threshold, cap, per-class NMS).
    Ties keep the detector's order (a stable sort)."""
    limit = rules.counting_threshold if tag == "counting" else rules.threshold
    by_class: dict[str, list[Detection]] = {}
    for det in detections:
        by_class.setdefault(det.label, []).append(det)
    kept: dict[str, list[Detection]] = {}
    for label, dets in by_class.items():
        order = sorted(dets, key=lambda d: -d.score)
        order = [d for d in order if d.score > limit][: rules.max_objects]
        chosen: list[Detection] = []
        while order:
            best = order.pop(0)
            chosen.append(best)
            if rules.nms_threshold < 1.0:
                order = [d for d in order if box_iou(best.box, d.box) < rules.nms_threshold]
        if chosen:
            kept[label] = chosen
    return kept


def relative_position(a: Detection, b: Detection, margin: float = 0.1) -> set[str]:
    """The relations of ``a`` to ``b`` (a subset of :data:`RELATIONS`), from their boxes."""
    box_a = np.asarray(a.box, dtype=np.float64)
    box_b = np.asarray(b.box, dtype=np.float64)
    centre_a = (box_a[:2] + box_a[2:]) / 2
    centre_b = (box_b[:2] + box_b[2:]) / 2
    size_a = np.abs(box_a[2:] - box_a[:2])
    size_b = np.abs(box_b[2:] - box_b[:2])
    offset = centre_a - centre_b
    shrunk = np.maximum(np.abs(offset) - margin * (size_a + size_b), 0) * np.sign(offset)
    if np.all(np.abs(shrunk) < 1e-3):
        return set()
    dx, dy = shrunk / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


ColourFn = Callable[[list[Detection], str], list[str]]
"""``(objects, class name) -> one colour name per object`` (the image is bound by the caller)."""


@dataclass
class RuleResult:
    """The verdict on one image: ``correct`` (every clause met), ``clauses_met`` /
    ``clauses_total`` (include and exclude clauses counted alike), ``reasons`` (why not)."""

    correct: bool
    clauses_met: int
    clauses_total: int
    reasons: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.clauses_met / self.clauses_total if self.clauses_total else 1.0


def check_metadata(meta: Mapping, where: str) -> None:
    """Raise one line naming the field when ``meta`` is not a GenEval record."""
    require(
        isinstance(meta, Mapping) and meta.get("tag") in TASKS,
        f"{where}: metadata['tag']={meta.get('tag') if isinstance(meta, Mapping) else meta!r} "
        f"is not a GenEval task; use one of {', '.join(TASKS)} (prompt files from "
        "datasets/geneval/evaluation_metadata.jsonl carry it)",
    )
    includes = meta.get("include")
    require(
        isinstance(includes, list) and len(includes) >= 1,
        f"{where}: metadata['include'] must be a non-empty list of {{class, count}} clauses",
    )
    assert isinstance(includes, list)  # the require above refuses anything else
    for clause in includes + list(meta.get("exclude", [])):
        require(
            isinstance(clause, Mapping)
            and isinstance(clause.get("class"), str)
            and isinstance(clause.get("count"), int)
            and clause["count"] >= 1,
            f"{where}: clause {clause!r} needs 'class' (a name) and 'count' (an integer >= 1)",
        )
        require(
            clause.get("color") is None or clause["color"] in COLORS,
            f"{where}: clause colour {clause.get('color')!r} is not one of {', '.join(COLORS)}",
        )
        position = clause.get("position")
        if position is not None:
            require(
                isinstance(position, Sequence)
                and len(position) == 2
                and position[0] in RELATIONS
                and isinstance(position[1], int),
                f"{where}: clause position {position!r} must be [relation, include index] with "
                f"relation one of {', '.join(RELATIONS)}",
            )


def evaluate_clauses(
    meta: Mapping, detected: Mapping[str, list[Detection]], colours: ColourFn, margin: float = 0.1
) -> RuleResult:
    """Apply ``meta``'s clauses to ``detected`` (from :func:`select_detections`)."""
    reasons: list[str] = []
    met = 0
    matched_groups: list[list[Detection] | None] = []
    includes = list(meta.get("include", []))
    excludes = list(meta.get("exclude", []))
    for clause in includes:
        name, count = clause["class"], int(clause["count"])
        found = list(detected.get(name, []))[:count]
        matched = True
        if len(found) < count:
            matched = False
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        else:
            if clause.get("color") is not None:
                got = colours(found, name)
                if got.count(clause["color"]) < count:
                    matched = False
                    seen = ", ".join(f"{got.count(c)} {c}" for c in COLORS if c in got)
                    reasons.append(
                        f"expected {clause['color']} {name}>={count}, found "
                        f"{got.count(clause['color'])} {clause['color']}; and {seen}"
                    )
            if matched and clause.get("position") is not None:
                relation, target = clause["position"][0], int(clause["position"][1])
                targets = matched_groups[target] if target < len(matched_groups) else None
                if targets is None:
                    matched = False
                    reasons.append(f"no target for {name} to be {relation}")
                else:
                    for obj in found:
                        for other in targets:
                            rel = relative_position(obj, other, margin)
                            if relation not in rel:
                                matched = False
                                shown = " and ".join(sorted(rel)) or "no relation"
                                reasons.append(
                                    f"expected {name} {relation} target, found {shown} target"
                                )
                                break
                        if not matched:
                            break
        matched_groups.append(found if matched else None)
        met += int(matched)
    for clause in excludes:
        name, count = clause["class"], int(clause["count"])
        have = len(detected.get(name, []))
        if have >= count:
            reasons.append(f"expected {name}<{count}, found {have}")
        else:
            met += 1
    total = len(includes) + len(excludes)
    return RuleResult(correct=met == total, clauses_met=met, clauses_total=total, reasons=reasons)


def task_table(tags: Sequence[str], correct: Sequence[float]) -> dict[str, float]:
    """Per-task accuracy (mean of ``correct`` over images of each tag present) and
    ``overall``, the mean of the task accuracies (the paper's Overall column)."""
    require(len(tags) == len(correct), "task_table: tags and correct differ in length")
    table: dict[str, float] = {}
    for tag in TASKS:
        values = [float(c) for t, c in zip(tags, correct, strict=True) if t == tag]
        if values:
            table[tag] = sum(values) / len(values)
    table["overall"] = sum(table.values()) / len(table) if table else math.nan
    return table


def format_table(table: Mapping[str, float], counts: Mapping[str, int] | None = None) -> str:
    """The paper's row: Overall, then the six tasks (as fractions, 2 decimals), a missing
    task shown as ``-``; with ``counts``, a second row of image counts per task."""
    heads = ["Overall", *(TASK_TITLES[t] for t in TASKS)]
    keys = ["overall", *TASKS]
    cells = [f"{table[k]:.2f}" if k in table else "-" for k in keys]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    lines.append("| " + " | ".join(cells) + " |")
    if counts is not None:
        total = sum(counts.values())
        lines.append(
            "| " + " | ".join([str(total), *(str(counts.get(t, 0)) for t in TASKS)]) + " |"
        )
    return "\n".join(lines)
