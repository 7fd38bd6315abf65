"""Math rewards for generated text: the boxed answer checked for mathematical equivalence
(sympy) and a format reward for the box itself.

Equivalence (:func:`math_equivalent`): equal after ``text_match.normalize_math`` or as
numbers (``text_match.math_equal``); else both sides are translated from the LaTeX that
answers use (``\\frac``, ``\\sqrt``, ``^``, ``\\cdot``, ``\\pi``, ``\\left( … \\right)``, a leading
``x =``) into sympy expressions and compared numerically: exactly-evaluated constants to a
relative 1e-9, expressions with free symbols at three fixed points. Model text never reaches
``eval`` unchecked: only digits, operators, brackets and a short list of names are let
through, numbers over 40 digits and exponents over 100 are refused (not equal), and
anything sympy cannot parse is simply "not equal".

What that translator cannot read (sets, intervals written ``x \\in [1, 2]``, units in
``\\text{}``, ``a=1, b=2`` against ``1, 2``) goes to math-verify (the grader verl uses), behind
the same size bounds: no answer over 200 characters, 40 digits, a factorial, a nested
exponent or one of three digits reaches it. Its own timeouts are off (they need the main
thread's signals; reward workers score off it), so the bounds are what keeps it quick.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from unirl.config import require
from unirl.reward.base import ScoreResult, TextRewardBackend, as_scores, check_lengths
from unirl.reward.local.text_match import _TextMatch, extract_boxed, math_equal, normalize_math

if TYPE_CHECKING:
    import sympy

_NAMES = {"sqrt", "pi", "sin", "cos", "tan", "log", "ln", "exp", "E"}
_SAFE = re.compile(r"^[0-9A-Za-z+\-*/().,\s]*$")
_MAX_LENGTH = 200
_MAX_DIGITS = 40
_MAX_EXPONENT = 100
_POINTS = (0.7311, 1.2917, 2.0813)


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """``(content, end)`` of the ``{...}`` group opening at ``text[start]``; None if unbalanced."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def _argument(text: str, start: int) -> tuple[str, int] | None:
    """A command's argument: a ``{...}`` group, or one character (``\\frac12``)."""
    if start < len(text) and text[start] != "{":
        return (text[start], start + 1) if text[start] not in "\\}" else None
    return _braced(text, start)


def _latex_commands(text: str) -> str | None:
    """``\\frac{a}{b}`` -> ``((a)/(b))``, ``\\sqrt{x}`` / ``\\sqrt[n]{x}``, recursively."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("\\frac", i):
            num = _argument(text, i + 5)
            den = _argument(text, num[1]) if num else None
            if num is None or den is None:
                return None
            a, b = _latex_commands(num[0]), _latex_commands(den[0])
            if a is None or b is None:
                return None
            out.append(f"(({a})/({b}))")
            i = den[1]
        elif text.startswith("\\sqrt", i):
            j = i + 5
            index = None
            if j < len(text) and text[j] == "[":
                close = text.find("]", j)
                if close < 0:
                    return None
                index, j = text[j + 1 : close], close + 1
            body = _argument(text, j)
            if body is None:
                return None
            inner = _latex_commands(body[0])
            if inner is None:
                return None
            out.append(f"sqrt({inner})" if index is None else f"(({inner})**(1/({index})))")
            i = body[1]
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def latex_to_sympy_text(answer: str) -> str | None:
    """The sympy-parseable text of a LaTeX answer, or None when it holds anything else."""
    text = normalize_math(answer)
    if len(text) > _MAX_LENGTH:
        return None
    text = re.sub(r"^[A-Za-z]\s*=", "", text)  # "x=3" answers 3
    for old, new in ((r"\cdot", "*"), (r"\times", "*"), (r"\div", "/"), (r"\pi", "pi")):
        text = text.replace(old, new)
    text = re.sub(r"\\(sin|cos|tan|log|ln|exp)\b", r"\1", text)
    text = text.replace(r"\%", "").replace("%", "").replace("^\\circ", "").replace("°", "")
    converted = _latex_commands(text)
    if converted is None:
        return None
    converted = converted.replace("{", "(").replace("}", ")").replace("^", "**")
    if not _SAFE.match(converted) or re.search(r"[A-Za-z_()]\.|\.[A-Za-z_(]", converted):
        return None  # a dot only as a decimal point: never an attribute access
    for name in re.findall(r"[A-Za-z]+", converted):
        if len(name) > 1 and name not in _NAMES:
            return None
    return converted


def _parse(text: str) -> sympy.Basic | tuple[sympy.Basic, ...] | None:
    """A sympy expression (or tuple of them), refusing huge numbers and exponents."""
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    if re.search(rf"\d{{{_MAX_DIGITS + 1},}}", text):
        return None
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    local = {"ln": sympy.log, "E": sympy.E, "e": sympy.E}
    try:
        expr = parse_expr(text, transformations=transformations, local_dict=local, evaluate=False)
    except Exception:  # sympy raises many kinds on malformed text: all mean "no expression"
        return None
    parts = expr if isinstance(expr, tuple) else (expr,)
    for part in parts:
        if not isinstance(part, sympy.Basic):
            return None
        for node in sympy.preorder_traversal(part):
            if isinstance(node, sympy.Pow) and node.exp.is_number:
                try:
                    if abs(float(node.exp)) > _MAX_EXPONENT:
                        return None
                except (TypeError, ValueError):
                    return None
    return expr


def _close(a: sympy.Basic, b: sympy.Basic) -> bool:
    import sympy

    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    points = [dict.fromkeys(symbols, p) for p in _POINTS] if symbols else [{}]
    for point in points:
        try:
            x = complex(sympy.N(a.subs(point), 30))
            y = complex(sympy.N(b.subs(point), 30))
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return False
        if not (abs(x - y) <= 1e-9 * max(1.0, abs(y))):  # NaN compares false
            return False
    return True


_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)$")


def is_number(answer: str) -> bool:
    """Whether an answer is a plain number: an integer or decimal, or ``\\frac`` of two."""
    text = normalize_math(answer).replace(",", "")
    if _NUMBER.match(text):
        return True
    frac = re.fullmatch(r"[-+]?\\frac\{(\d+)\}\{(\d+)\}", text)
    return frac is not None


def math_equivalent(predicted: str, reference: str) -> bool:
    """Whether two answers are the same value (see the module docstring)."""
    if math_equal(predicted, reference):
        return True
    if _sympy_equivalent(predicted, reference):
        return True
    return _math_verify_equivalent(predicted, reference)


def _sympy_equivalent(predicted: str, reference: str) -> bool:
    p_text, r_text = latex_to_sympy_text(predicted), latex_to_sympy_text(reference)
    if not p_text or not r_text:
        return False
    p, r = _parse(p_text), _parse(r_text)
    if p is None or r is None:
        return False
    if isinstance(p, tuple) or isinstance(r, tuple):
        if not (isinstance(p, tuple) and isinstance(r, tuple)) or len(p) != len(r):
            return False
        return all(_close(a, b) for a, b in zip(p, r, strict=True))
    return _close(p, r)


# refused before math-verify sees it: a nested exponent, one of 3+ digits, a factorial
_COSTLY = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\{?\s*[-+]?\d{3,}|!")


def _within_bounds(text: str) -> bool:
    return (
        0 < len(text) <= _MAX_LENGTH
        and not re.search(rf"\d{{{_MAX_DIGITS + 1},}}", text)
        and not _COSTLY.search(text)
    )


def _math_verify_equivalent(predicted: str, reference: str) -> bool:
    """math-verify's ``verify`` on both answers read as LaTeX (``$…$``)."""
    if not (_within_bounds(predicted) and _within_bounds(reference)):
        return False
    import math_verify

    gold = math_verify.parse(f"${reference}$", parsing_timeout=None)  # type: ignore[arg-type]
    answer = math_verify.parse(f"${predicted}$", parsing_timeout=None)  # type: ignore[arg-type]
    if not gold or not answer:
        return False
    return bool(math_verify.verify(gold, answer, timeout_seconds=None))


@dataclass(kw_only=True)
class MathAnswer(_TextMatch):
    """1.0 when the last ``\\boxed{...}`` of the completion is :func:`math_equivalent` to an
    answer in ``metadata[answer_key]`` (a boxed reference is unboxed first); 0.0 otherwise,
    including when there is no complete box."""

    name: str = "math_answer"

    def matches(self, text: str, answers: list[str]) -> bool:
        predicted = extract_boxed(text)
        if predicted is None:
            return False
        return any(math_equivalent(predicted, extract_boxed(a) or a) for a in answers)


@dataclass(kw_only=True)
class BoxedFormat(TextRewardBackend):
    """A format reward for a final answer in a box: 1.0 for a complete ``\\boxed{...}`` (the
    last one) whose content is what ``expect`` asks for; ``open_credit`` when a box is opened
    but never closed; ``mismatch_credit`` for a complete box holding something else; 0.0
    without a box. ``expect``: ``any`` content, a ``number`` (``12``, ``-3.5``,
    ``\\frac{1}{2}``) or a ``choice`` (one of ``letters``, optionally in parentheses)."""

    name: str = "boxed_format"
    open_credit: float = 0.0
    expect: Literal["any", "number", "choice"] = "any"
    letters: str = "ABCDE"
    mismatch_credit: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name), "BoxedFormat.name must be non-empty")
        for field in ("open_credit", "mismatch_credit"):
            value = getattr(self, field)
            require(0.0 <= value <= 1.0, f"BoxedFormat.{field} must be in [0, 1], got {value}")
        require(
            self.expect in ("any", "number", "choice"),
            f"BoxedFormat.expect must be any, number or choice, got {self.expect!r}",
        )
        require(
            bool(self.letters) and self.letters.isalpha() and self.letters.isupper(),
            f"BoxedFormat.letters={self.letters!r}: give upper-case option letters, e.g. 'ABCD'",
        )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def _fits(self, content: str) -> bool:
        if self.expect == "number":
            return is_number(content)
        if self.expect == "choice":
            letter = content.strip().strip("()").strip()
            return len(letter) == 1 and letter in self.letters
        return True

    def score_one(self, text: str) -> float:
        if not re.search(r"\\(?:boxed|fbox)\s*\{", text):
            return 0.0
        content = extract_boxed(text)
        if content is None:
            return self.open_credit
        return 1.0 if self._fits(content) else self.mismatch_credit

    def score_texts(
        self, texts: list[str], prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        check_lengths(len(texts), type(self).__name__, prompts=prompts, metadata=metadata)
        return ScoreResult(scores={self.name: as_scores([self.score_one(t) for t in texts])})
