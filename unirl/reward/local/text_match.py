"""Rule-based rewards for generated text (AR tracks): exact match, boxed math, multiple choice.

Each reads the reference from ``metadata[answer_key]`` (a string, or a list of accepted
strings) and scores 1.0 for a match, 0.0 otherwise. A sample without an answer raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from unirl.config import require
from unirl.reward.base import RewardError, ScoreResult, TextRewardBackend, as_scores, check_lengths


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces balanced.

    Returns ``None`` when there is no complete boxed expression.
    """
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


_LATEX_NOISE = (r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", "$")


def normalize_math(answer: str) -> str:
    """Canonical string form: no whitespace / ``$`` / sizing commands, ``\\dfrac`` -> ``\\frac``."""
    out = answer.strip()
    for token in _LATEX_NOISE:
        out = out.replace(token, "")
    out = out.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    out = re.sub(r"\\text\{([^{}]*)\}", r"\1", out)
    out = re.sub(r"\s+", "", out)
    return out.rstrip(".")


def _as_number(text: str) -> float | None:
    candidate = text.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text) else text
    try:
        return float(candidate)
    except ValueError:
        return None


def math_equal(predicted: str, reference: str) -> bool:
    """Equal after :func:`normalize_math`, or as numbers within relative 1e-9."""
    p, r = normalize_math(predicted), normalize_math(reference)
    if p == r:
        return True
    pn, rn = _as_number(p), _as_number(r)
    if pn is None or rn is None:
        return False
    return abs(pn - rn) <= 1e-9 * max(1.0, abs(rn))


def extract_choice(text: str, letters: str) -> str | None:
    """The chosen option letter, tried in order: ``\\boxed{X}``; the last ``answer is X`` /
    ``answer: (X)``; the last ``(X)``; a reply that is only ``X``, ``X.`` or ``X)``.

    A bare capital elsewhere (e.g. the article "A") is not taken as a choice.
    """
    cls = "[" + re.escape(letters) + "]"
    boxed = extract_boxed(text)
    if boxed is not None and re.fullmatch(rf"\s*\(?({cls})\)?\s*", boxed):
        return boxed.strip().strip("()")
    patterns = (
        (rf"answer(?:\s+is)?\s*[:：]?\s*\(?({cls})\b\)?", re.IGNORECASE),
        (rf"\(({cls})\)", 0),
    )
    for pattern, flags in patterns:
        # IGNORECASE is for the word "answer"; a lower-case letter is not an option.
        found = [f for f in re.findall(pattern, text, flags=flags) if f in letters]
        if found:
            return found[-1]
    only = re.fullmatch(rf"\s*\(?({cls})[.)]?\s*", text)
    return only.group(1) if only else None


def _answers(meta: dict, key: str, index: int, source: str) -> list[str]:
    if not meta or meta.get(key) is None:
        raise RewardError(
            f"{source}: sample {index} has no metadata[{key!r}] reference answer "
            "(add it to the prompt file)"
        )
    value = meta[key]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


@dataclass(kw_only=True)
class _TextMatch(TextRewardBackend):
    """1.0 when the completion matches one of the sample's answers, else 0.0.
    ``answer_key``: the metadata key holding the answer (a string or a list of them)."""

    answer_key: str = "answer"
    name: str = "match"

    def __post_init__(self) -> None:
        require(bool(self.name), f"{type(self).__name__}.name must be non-empty")
        require(bool(self.answer_key), f"{type(self).__name__}.answer_key must be non-empty")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def matches(self, text: str, answers: list[str]) -> bool:
        raise NotImplementedError

    def score_texts(
        self, texts: list[str], prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        n = len(texts)
        source = type(self).__name__
        check_lengths(n, source, prompts=prompts, metadata=metadata)
        values = [
            1.0 if self.matches(text, _answers(meta, self.answer_key, i, source)) else 0.0
            for i, (text, meta) in enumerate(zip(texts, metadata))
        ]
        return ScoreResult(scores={self.name: as_scores(values)})


@dataclass(kw_only=True)
class ExactMatch(_TextMatch):
    """1.0 when the text equals an answer (stripped; case-folded and whitespace-collapsed
    when ``normalize``)."""

    normalize: bool = True
    name: str = "exact_match"

    def _norm(self, text: str) -> str:
        return " ".join(text.split()).casefold() if self.normalize else text.strip()

    def matches(self, text: str, answers: list[str]) -> bool:
        return any(self._norm(text) == self._norm(a) for a in answers)


@dataclass(kw_only=True)
class BoxedMathAnswer(_TextMatch):
    """1.0 when the last ``\\boxed{...}`` equals an answer (:func:`math_equal`); 0.0 if no box."""

    name: str = "boxed_math"

    def matches(self, text: str, answers: list[str]) -> bool:
        predicted = extract_boxed(text)
        if predicted is None:
            return False
        return any(math_equal(predicted, extract_boxed(a) or a) for a in answers)


@dataclass(kw_only=True)
class MultipleChoice(_TextMatch):
    """1.0 when the chosen letter (:func:`extract_choice`) equals the answer letter.
    ``letters``: the option letters a choice may be (upper case)."""

    letters: str = "ABCDE"
    name: str = "multiple_choice"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            bool(self.letters) and self.letters.isalpha() and self.letters.isupper(),
            f"MultipleChoice.letters={self.letters!r}: give upper-case option letters, e.g. 'ABCD'",
        )

    def matches(self, text: str, answers: list[str]) -> bool:
        choice = extract_choice(text, self.letters)
        return choice is not None and any(choice == a.strip().strip("()").upper() for a in answers)
