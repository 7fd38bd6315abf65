"""Generative VLM judges: the model writes its verdict (greedy, KV-cached ``generate`` with a
bounded ``max_new_tokens``) and the score is parsed from the text.

Error policy (every judge here): an answer the parser cannot read, or a value outside the
rubric's range, scores NaN for that sample with an error naming the sample, what was expected
and the start of the answer (and whether it hit ``max_new_tokens``); the other samples keep
their scores. ``RewardService``'s ``failure_policy`` then decides: ``raise`` stops the step
naming the sample, ``drop_group`` drops its group. Nothing is ever read as 0.
``<name>/unparsed`` counts those samples.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from unirl.config import require
from unirl.reward.base import (
    ScoreResult,
    check_images,
    check_lengths,
    check_video_call,
    images_to_uint8,
)
from unirl.reward.local.vlm.engine import (
    ChatTurn,
    QwenVLScorer,
    Visual,
    image_chat,
    sample_frames,
    video_chat,
)
from unirl.reward.local.vlm.templates import (
    UNIFIEDREWARD_IMAGE,
    UNIFIEDREWARD_VIDEO,
    WISE_PROMPT,
    WISE_SYSTEM,
)

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
FINAL_SCORE = re.compile(r"Final Score:\s*\**\s*" + _NUMBER)
# WISE's own reader (WISE_legacy/gpt_eval.py extract_scores), rewritten
WISE_LABELED = re.compile(
    r"\*{0,2}(Consistency|Realism|Aesthetic Quality)\*{0,2}\s*[:：]?\s*(\d)", re.I
)
WISE_BARE = re.compile(r"(?m)^\s*([0-2])\s*$")
WISE_KEYS = ("consistency", "realism", "aesthetic_quality")
WISE_WEIGHTS = (0.7, 0.2, 0.1)


class Unparsed(ValueError):
    """The judge's answer does not hold a readable, in-range verdict."""


def parse_final_score(text: str, low: float, high: float) -> float:
    """The number after the first ``Final Score:`` (markdown bold allowed); it must lie in
    ``[low, high]``."""
    match = FINAL_SCORE.search(text)
    if match is None:
        raise Unparsed("no 'Final Score: <number>'")
    value = float(match.group(1))
    if not low <= value <= high:
        raise Unparsed(f"Final Score {value:g} is outside [{low:g}, {high:g}]")
    return value


def parse_wise(text: str) -> tuple[float, float, float]:
    """``(consistency, realism, aesthetic quality)`` as WISE reads them: the first
    ``<Name>: <digit>`` of each (case-insensitive, ``**`` allowed), else three bare lines
    ``0``-``2`` in that order. All three are required, each in {0, 1, 2}."""
    found: dict[str, float] = {}
    for key, value in WISE_LABELED.findall(text):
        found.setdefault(key.lower().replace(" ", "_"), float(value))
    if not found:
        bare = WISE_BARE.findall(text)
        if len(bare) >= 3:
            found = dict(zip(WISE_KEYS, (float(v) for v in bare[:3]), strict=True))
    missing = [k for k in WISE_KEYS if k not in found]
    if missing:
        raise Unparsed(f"no score for {', '.join(missing)}")
    out = tuple(found[k] for k in WISE_KEYS)
    bad = [f"{k}={v:g}" for k, v in zip(WISE_KEYS, out, strict=True) if v not in (0.0, 1.0, 2.0)]
    if bad:
        raise Unparsed(f"{', '.join(bad)} outside 0-2")
    return out  # type: ignore[return-value]


def wiscore(consistency: float, realism: float, aesthetic: float) -> float:
    """WISE's WiScore of one image: ``(0.7 c + 0.2 r + 0.1 a) / 2`` in [0, 1]."""
    c, r, a = WISE_WEIGHTS
    return (c * consistency + r * realism + a * aesthetic) / 2.0


@dataclass(kw_only=True)
class GenerativeJudge(QwenVLScorer):
    """Base of the judges: left-padded batches, greedy generation, per-sample parsing with the
    module's error policy. Subclasses give the chats and :meth:`read` (text -> score, extras)."""

    max_new_tokens: int = 256  # generation budget per answer; an answer cut off here that holds no verdict is an error

    padding_side: ClassVar[str] = "left"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
            f"{type(self).__name__}.max_new_tokens={self.max_new_tokens!r}: use a positive integer",
        )

    @abstractmethod
    def read(self, text: str, video: bool) -> tuple[float, dict[str, float]]:
        """``(score, extras)`` of one answer (to an image or a video prompt); raises
        :class:`Unparsed`."""

    def judge(
        self,
        chats: list[list[ChatTurn]],
        visuals: list[list[Visual]],
        first: int,
        video: bool = False,
    ) -> tuple[Tensor, list[str | None], dict[str, Tensor], list[str]]:
        """Generate and read one chunk (``first``: the index of its first sample)."""
        batch = self.build_batch(chats, visuals)
        texts, stopped = self.generate_texts(batch, self.max_new_tokens)
        values: list[float] = []
        errors: list[str | None] = []
        per_sample: list[dict[str, float]] = []
        for i, (text, done) in enumerate(zip(texts, stopped, strict=True)):
            try:
                value, extra = self.read(text, video)
                error = None
            except Unparsed as exc:
                value, extra = float("nan"), {}
                cut = "" if done else f" (cut off at max_new_tokens={self.max_new_tokens})"
                error = f"{type(self).__name__}: sample {first + i}: {exc} in the answer{cut}: {text[:120]!r}"
            values.append(value)
            errors.append(error)
            per_sample.append(extra)
        keys = sorted({k for extra in per_sample for k in extra})
        full = {
            k: torch.tensor([e.get(k, float("nan")) for e in per_sample], dtype=torch.float64)
            for k in keys
        }
        full["unparsed"] = torch.tensor([float(e is not None) for e in errors], dtype=torch.float64)
        return torch.tensor(values, dtype=torch.float64), errors, full, texts

    def _score_chats(
        self,
        n: int,
        make: Callable[[int, int], tuple[list[list[ChatTurn]], list[list[Visual]]]],
        video: bool = False,
    ) -> ScoreResult:
        """Score ``n`` samples; ``make(start, stop) -> (chats, visuals)``. ``<name>/unparsed``
        is the count of unreadable answers (the other extras are means)."""
        unparsed = 0.0

        def call(start: int, stop: int):
            nonlocal unparsed
            chats, visuals = make(start, stop)
            values, errors, extras, _ = self.judge(chats, visuals, start, video)
            unparsed += float(extras.pop("unparsed").sum())
            return values, errors, extras

        values, errors, metrics = self._chunked(n, call)
        metrics[f"{self.name}/unparsed"] = unparsed
        return self._finish(values, errors, metrics)


@dataclass(kw_only=True)
class UnifiedReward(GenerativeJudge):
    """UnifiedReward-2.0 (Qwen2.5-VL) pointwise score of an image or a video.

    Images: one user turn, the image then the released pointwise image prompt with the
    caption; the model's ``Final Score:`` is read (1-5). Videos (``score_video``): the frames
    at ``sample_fps`` (at most ``max_frames``) as one video, then the released video prompt;
    ``Final Score:`` 1-10. The number after the first ``Final Score:`` is the score, mapped
    to [0, 1] by ``(s - low) / (high - low)`` when ``unit_scale``. Unreadable or out-of-range
    answers follow the judges' error policy (NaN with an error, never 0).
    """

    path: str = "CodeGoat24/UnifiedReward-2.0-qwen-7b"  # hub id or local folder of a UnifiedReward-2.0 Qwen2.5-VL checkpoint
    name: str = "unified_reward"  # component name of the score
    batch_size: int = 8  # samples per generate call
    max_new_tokens: int = (
        512  # the answer lists elements before the score; the model card generates up to 512
    )
    unit_scale: bool = False  # map the score to [0, 1] (images: (s-1)/4, videos: (s-1)/9)
    sample_fps: float = 2.0  # video frames per second fed to the model
    max_frames: int = 32  # at most this many frames per video
    max_frame_pixels: int | None = 448 * 448  # each video frame's pixel upper bound after resizing

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.sample_fps > 0, f"UnifiedReward.sample_fps={self.sample_fps}: use a value > 0")
        require(
            isinstance(self.max_frames, int) and self.max_frames >= 1,
            f"UnifiedReward.max_frames={self.max_frames!r}: use a positive integer",
        )

    @property
    def frame_pixels(self) -> int | None:
        return self.max_frame_pixels if self.max_frame_pixels is not None else self.max_pixels

    def read(self, text: str, video: bool) -> tuple[float, dict[str, float]]:
        low, high = (1.0, 10.0) if video else (1.0, 5.0)
        raw = parse_final_score(text, low, high)
        value = (raw - low) / (high - low) if self.unit_scale else raw
        return value, {"final_score": raw}

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "UnifiedReward", metadata=metadata)
        images = check_images(images, n, "UnifiedReward")

        def make(start: int, stop: int):
            chats = [image_chat(UNIFIEDREWARD_IMAGE.format(prompt=p)) for p in prompts[start:stop]]
            return chats, [[("image", a)] for a in images_to_uint8(images[start:stop])]

        return self._score_chats(n, make)

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(prompts)
        frames = check_video_call(frames, prompts, metadata, "UnifiedReward", fps)
        chosen = sample_frames(frames.shape[1], fps, self.sample_fps, self.max_frames)

        def make(start: int, stop: int):
            u8 = frames[start:stop, chosen].detach().float().clamp(0, 1).mul(255).round()
            arrays = u8.to(torch.uint8).permute(0, 1, 3, 4, 2).cpu().numpy()
            chats = [video_chat(UNIFIEDREWARD_VIDEO.format(prompt=p)) for p in prompts[start:stop]]
            return chats, [[("video", v)] for v in arrays]

        return self._score_chats(n, make, video=True)


@dataclass(kw_only=True)
class WISEJudge(GenerativeJudge):
    """WISE's rubric asked of a local Qwen2.5-VL judge: WiScore ``(0.7 c + 0.2 r + 0.1 a) / 2``.

    The chat is WISE's GPT-4o evaluation: the system text, then one user turn with the
    protocol (the prompt and ``metadata[i][explanation_key]`` filled in) followed by the image.
    The answer's Consistency, Realism and Aesthetic Quality (each 0-2) are read as WISE reads
    them; ``<name>/consistency|realism|aesthetic_quality`` log their means. A sample without
    an explanation gets ``missing_explanation`` in its place (WISE's prompt files always have
    one; prompt files without it still get a judge of the prompt alone).
    """

    path: str = "Qwen/Qwen2.5-VL-7B-Instruct"  # hub id or local folder of the Qwen2.5-VL judge
    name: str = "wise"  # component name of the score
    batch_size: int = 8  # images per generate call
    max_new_tokens: int = 64  # the rubric asks for three short lines
    explanation_key: str = "explanation"  # metadata key holding WISE's Explanation of the prompt
    missing_explanation: str = ""  # EXPLANATION text for samples whose metadata has none

    def read(self, text: str, video: bool) -> tuple[float, dict[str, float]]:
        c, r, a = parse_wise(text)
        return wiscore(c, r, a), {"consistency": c, "realism": r, "aesthetic_quality": a}

    def text(self, prompt: str, meta: dict) -> str:
        """The protocol text of one sample."""
        explanation = meta.get(self.explanation_key)
        if explanation is None:
            explanation = self.missing_explanation
        return WISE_PROMPT.format(prompt=prompt, explanation=str(explanation))

    def chat(self, prompt: str, meta: dict) -> list[ChatTurn]:
        """System turn, then the protocol text and the image (WISE puts the image last)."""
        return [
            {"role": "system", "content": [{"type": "text", "text": WISE_SYSTEM}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": self.text(prompt, meta)}, {"type": "image"}],
            },
        ]

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        n = len(prompts)
        check_lengths(n, "WISEJudge", metadata=metadata)
        images = check_images(images, n, "WISEJudge")

        def make(start: int, stop: int):
            chats = [
                self.chat(p, m)
                for p, m in zip(prompts[start:stop], metadata[start:stop], strict=True)
            ]
            return chats, [[("image", a)] for a in images_to_uint8(images[start:stop])]

        return self._score_chats(n, make)
