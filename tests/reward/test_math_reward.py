"""Math rewards: sympy equivalence of boxed answers, refusal of unsafe or oversized input,
the format ladder, and both through the RewardService on a text track."""

from __future__ import annotations

import time

import pytest
import torch

from unirl.config import ConfigError
from unirl.reward import RewardService, WeightedRewardBackend
from unirl.reward.local.math_reward import (
    BoxedFormat,
    MathAnswer,
    is_number,
    latex_to_sympy_text,
    math_equivalent,
)
from unirl.types import RolloutTrack, Texts

EQUAL = [
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{6}", "\\frac12"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("x = 3", "3"),
    ("(1, 2)", "(1,2)"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("10^{2}", "100"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)"),
    ("1,000", "1000"),
    ("50\\%", "50"),
    ("\\left(\\frac{1}{3}\\right)", "0.3333333333333333"),
]
DIFFERENT = [
    ("7", "8"),
    ("\\frac{1}{3}", "0.33"),
    ("(1, 2)", "(2, 1)"),
    ("x^2", "2x"),
    ("\\frac{1}{0}", "1"),
    ("", "0"),
]


@pytest.mark.parametrize(("a", "b"), EQUAL)
def test_equivalent_answers(a: str, b: str) -> None:
    assert math_equivalent(a, b) and math_equivalent(b, a)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_answers(a: str, b: str) -> None:
    assert not math_equivalent(a, b)


def test_unsafe_or_huge_input_is_never_evaluated() -> None:
    for text in ('__import__("os").system("true")', "lambda: 1", "x.y", "a[0]", "open(1)"):
        assert latex_to_sympy_text(text) is None, text
        assert not math_equivalent(text, "1")
    start = time.perf_counter()
    assert not math_equivalent("9^{9^{9^{9}}}", "1")  # exponent over 100: refused, not computed
    assert not math_equivalent("1" * 60, "1")  # a 60-digit number: refused
    assert not math_equivalent("x" * 500, "1")  # over the length bound
    assert time.perf_counter() - start < 5.0


def test_is_number() -> None:
    assert all(is_number(t) for t in ("7", "-3.5", "\\frac{1}{2}", "1,000", ".5"))
    assert not any(is_number(t) for t in ("x", "", "1/2x", "\\sqrt{2}"))


def test_math_answer_reads_the_last_box_against_every_accepted_answer() -> None:
    scorer = MathAnswer()
    texts = [
        "so \\boxed{3} then \\boxed{\\frac{14}{2}}",
        "the answer is 7",
        "\\boxed{7.0}",
        "\\boxed{8}",
    ]
    result = scorer.score_texts(texts, ["q"] * 4, [{"answer": "7"}] * 3 + [{"answer": ["9", "8"]}])
    assert result.scores["math_answer"].tolist() == [1.0, 0.0, 1.0, 1.0]


def test_boxed_format_ladder() -> None:
    plain = BoxedFormat()
    ladder = BoxedFormat(open_credit=0.25, expect="number", mismatch_credit=0.5)
    texts = ["\\boxed{7}", "\\boxed{seven}", "\\boxed{}", "\\boxed{7", "7"]
    assert [plain.score_one(t) for t in texts] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [ladder.score_one(t) for t in texts] == [1.0, 0.5, 0.5, 0.25, 0.0]
    choice = BoxedFormat(expect="choice", letters="ABCD", mismatch_credit=0.5)
    picks = ["\\boxed{B}", "\\boxed{(C)}", "\\boxed{E}", "\\boxed{AB}", "\\boxed{b}"]
    assert [choice.score_one(t) for t in picks] == [1.0, 1.0, 0.5, 0.5, 0.5]
    with pytest.raises(ConfigError, match="open_credit"):
        BoxedFormat(open_credit=1.5)
    with pytest.raises(ConfigError, match="expect"):
        BoxedFormat(expect="letter")  # type: ignore[arg-type]


def test_through_the_reward_service_on_a_text_track() -> None:
    backend = WeightedRewardBackend(
        components={"answer": MathAnswer(), "format": BoxedFormat(expect="number")},
        weights={"answer": 1.0, "format": 0.5},
    )
    track = RolloutTrack(
        sample_ids=torch.arange(3),
        group_ids=torch.zeros(3, dtype=torch.long),
        prompts=["What is 3 + 4?"] * 3,
        metadata=[{"answer": "7"}] * 3,
        decoded=Texts(texts=["\\boxed{7}", "\\boxed{6}", "no box"]),
    )
    scored, metrics = RewardService(backend=backend).score_track(track)
    assert scored.rewards.tolist() == [1.5, 0.5, 0.0]
    assert metrics["reward/answer/mean"] == pytest.approx(1 / 3)
    with pytest.raises(Exception, match="metadata\\['answer'\\]"):
        MathAnswer().score_texts(["\\boxed{1}"], ["q"], [{}])


# answers the hand-written translator alone called different; math-verify matches them
MISSED_BY_HAND = [
    ("x \\in [1, 2]", "[1,2]"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("3 \\text{ cm}", "3"),
    ("a=1, b=2", "1, 2"),
]


@pytest.mark.parametrize(("a", "b"), MISSED_BY_HAND)
def test_math_verify_matches_what_the_hand_written_check_missed(a: str, b: str) -> None:
    from unirl.reward.local.math_reward import _sympy_equivalent
    from unirl.reward.local.text_match import math_equal

    assert not math_equal(a, b) and not _sympy_equivalent(a, b)
    assert math_equivalent(a, b)


def test_math_verify_never_sees_costly_input() -> None:
    from unirl.reward.local.math_reward import _math_verify_equivalent

    start = time.perf_counter()
    for text in ("9^{9^{9}}", "2^{1000}", "100000!", "1" * 60, "x" * 300):
        assert not _math_verify_equivalent(text, "1"), text
    assert time.perf_counter() - start < 1.0
