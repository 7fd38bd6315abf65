"""Rule-based text rewards for AR tracks."""

from __future__ import annotations

import pytest
import torch

from unirl.reward import RewardError
from unirl.reward.local import (
    BoxedMathAnswer,
    ExactMatch,
    MultipleChoice,
    extract_boxed,
    extract_choice,
    math_equal,
)


def test_extract_boxed_takes_the_last_and_balances_braces():
    assert extract_boxed(r"so \boxed{1} or rather \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{{a}{b{c}}}") == "{a}{b{c}}"
    assert extract_boxed(r"\fbox{7}") == "7"
    assert extract_boxed("no box") is None
    assert extract_boxed(r"\boxed{unclosed") is None
    # an unclosed last box falls back to the previous complete one
    assert extract_boxed(r"\boxed{3} then \boxed{4") == "3"


def test_math_equal():
    assert math_equal(r"\dfrac{1}{2}", r"\frac{1}{2}")
    assert math_equal("$ 3.0 $", "3")
    assert math_equal("1,000", "1000")
    assert math_equal(r"\left(1, 2\right)", "(1,2)")
    assert not math_equal("2", "3")
    assert not math_equal("x+1", "x+2")


def test_extract_choice():
    assert extract_choice("The answer is B.", "ABCD") == "B"
    assert extract_choice("A cat sat. Answer: (C)", "ABCD") == "C"
    assert extract_choice(r"thus \boxed{D}", "ABCD") == "D"
    assert extract_choice("I pick (A) over (B)", "ABCD") == "B"
    assert extract_choice(" C. ", "ABCD") == "C"
    assert extract_choice("A cat is not an answer", "ABCD") is None
    assert extract_choice("the answer is e", "ABCD") is None


def test_text_backends_score_texts():
    texts = [r"work... \boxed{42}", "Answer: B", "  Paris ", "nothing"]
    meta = [
        {"answer": "42"},
        {"answer": "b"},
        {"answer": ["paris", "Paris, France"]},
        {"answer": "x"},
    ]
    prompts = ["q"] * 4
    boxed = BoxedMathAnswer().score_texts(texts, prompts, meta).scores["boxed_math"]
    choice = (
        MultipleChoice(letters="ABCD").score_texts(texts, prompts, meta).scores["multiple_choice"]
    )
    exact = ExactMatch().score_texts(texts, prompts, meta).scores["exact_match"]
    assert boxed.dtype == torch.float32
    assert boxed.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert choice.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert exact.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert ExactMatch(normalize=False).score_texts(["paris"], ["q"], [{"answer": "Paris"}]).scores[
        "exact_match"
    ].tolist() == [0.0]


def test_text_backend_errors():
    with pytest.raises(RewardError, match=r"sample 1 has no metadata\['answer'\]"):
        ExactMatch().score_texts(["a", "b"], ["q", "q"], [{"answer": "a"}, {}])
    with pytest.raises(TypeError, match="track decoded images"):
        ExactMatch().score(torch.zeros(1, 3, 2, 2), ["q"], [{}])
