"""``GenEval``: the benchmark's verdict as a reward, with per-task accuracies as metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import RewardBackend, ScoreResult, check_images, check_lengths
from unirl.reward.local.geneval.rules import (
    Detection,
    GenEvalRules,
    RuleResult,
    check_metadata,
    evaluate_clauses,
    select_detections,
    task_table,
)


@dataclass(kw_only=True)
class GenEval(RewardBackend):
    """Score each image by GenEval's rules on its prompt's metadata (``tag``, ``include``,
    ``exclude``, as in ``datasets/geneval/*.jsonl``).

    ``detector``: an object with ``detect(images) -> list[list[Detection]]``
    (:class:`Mask2FormerDetector` for the benchmark, :class:`ColourBlobDetector` for the
    quick-start); ``colours``: a colour classifier (:class:`CLIPColourClassifier` for the
    benchmark), needed only by prompts with a colour clause; ``rules``: the thresholds;
    ``reward``: ``correct`` (1 when every clause holds, the benchmark's score) or
    ``clause_fraction`` (the fraction of include and exclude clauses that hold, a denser
    signal for training). Metrics: ``<name>/<tag>`` accuracy per task present,
    ``<name>/overall`` (mean over those tasks), ``<name>/clause_fraction``.
    """

    detector: Any
    colours: Any = None
    rules: Any = field(default_factory=GenEvalRules)
    reward: str = "correct"
    name: str = "geneval"

    def __post_init__(self) -> None:
        if isinstance(self.rules, Mapping) or hasattr(self.rules, "items"):
            self.rules = GenEvalRules(**dict(self.rules))
        for slot in ("detector", "colours"):
            value = getattr(self, slot)
            if value is not None and hasattr(value, "_metadata"):  # an OmegaConf node
                from omegaconf import OmegaConf

                setattr(self, slot, OmegaConf.to_object(value))
        require(
            hasattr(self.detector, "detect"),
            "GenEval.detector: give a detector ({_target_: unirl.reward.local.geneval."
            "Mask2FormerDetector} or ColourBlobDetector)",
        )
        require(
            self.reward in ("correct", "clause_fraction"),
            f"GenEval.reward={self.reward!r}: use 'correct' or 'clause_fraction'",
        )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def judge(self, images: Tensor, metadata: list[dict]) -> list[RuleResult]:
        """The rule verdict per image (detector, selection, clauses)."""
        detections = self.detector.detect(images)
        require(
            len(detections) == len(metadata),
            f"GenEval: the detector returned {len(detections)} results for {len(metadata)} images",
        )
        results = []
        for image, dets, meta in zip(images, detections, metadata, strict=True):
            kept = select_detections(dets, meta["tag"], self.rules)
            results.append(evaluate_clauses(meta, kept, self._colour_fn(image), self._margin))
        return results

    @property
    def _margin(self) -> float:
        return float(self.rules.position_margin)

    def _colour_fn(self, image: Tensor) -> Callable[[list[Detection], str], list[str]]:
        def classify(objects: list[Detection], classname: str) -> list[str]:
            require(
                self.colours is not None,
                "GenEval.colours is null but a prompt has a colour clause; set colours: "
                "{_target_: unirl.reward.local.geneval.CLIPColourClassifier}",
            )
            return list(self.colours.classify(image, objects, classname))

        return classify

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "GenEval", metadata=metadata)
        for i, meta in enumerate(metadata):
            check_metadata(meta, f"GenEval sample {i} ({prompts[i]!r})")
        images = check_images(images, n, "GenEval")
        results = self.judge(images.detach().float().cpu().clamp(0, 1), metadata)
        correct = [float(r.correct) for r in results]
        fraction = [r.fraction for r in results]
        values = correct if self.reward == "correct" else fraction
        tags = [m["tag"] for m in metadata]
        metrics = {f"{self.name}/{k}": v for k, v in task_table(tags, correct).items()}
        metrics[f"{self.name}/clause_fraction"] = sum(fraction) / max(n, 1)
        return ScoreResult(
            scores={self.name: torch.tensor(values, dtype=torch.float32)}, metrics=metrics
        )
