"""Generate the arithmetic sets for the LLM recipes (JSON lines: prompt, answer, level).

    python datasets/make_arithmetic_prompts.py        # writes datasets/arithmetic/*.jsonl

- ``easy.jsonl`` (110): every ``a + b`` and ``a - b`` over digits whose result is one digit,
  for the CPU quick-start (a tiny random model can learn to answer in a box).
- ``train.jsonl`` (1200) / ``test.jsonl`` (150): three levels, a third each: one-digit
  results, two-digit ``+ - *``, and short word problems (two steps); the generated levels
  share no question between the sets.

Every prompt asks for the answer in ``\\boxed{}``; ``answer`` is the exact integer as text
(``MathAnswer`` reads it). Deterministic: ``random.Random(seed)``, seed 0 for the committed
files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from prompt_io import generator_main

INSTRUCTION = "Put the final answer in \\boxed{}."
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jun")
ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "shells", "cards")


def record(question: str, answer: int, level: int) -> dict[str, object]:
    return {"prompt": f"{question} {INSTRUCTION}", "answer": str(answer), "level": level}


def easy_problems() -> list[dict[str, object]]:
    """Every one-digit ``a + b`` and ``a - b`` with a one-digit result, sums first."""
    out = []
    for a in range(10):
        for b in range(10 - a):
            out.append(record(f"What is {a} + {b}?", a + b, 1))
    for a in range(10):
        for b in range(a + 1):
            out.append(record(f"What is {a} - {b}?", a - b, 1))
    return out


def two_digit(rng: random.Random) -> dict[str, object]:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 19), rng.randint(2, 9)
        return record(f"What is {a} * {b}?", a * b, 2)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if op == "-":
        a, b = max(a, b), min(a, b)
        return record(f"What is {a} - {b}?", a - b, 2)
    return record(f"What is {a} + {b}?", a + b, 2)


def word_problem(rng: random.Random) -> dict[str, object]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, more = rng.randint(2, 40), rng.randint(2, 30)
    kind = rng.randrange(3)
    if kind == 0:
        given = rng.randint(1, start + more - 1)
        question = (
            f"{name} has {start} {item}, buys {more} more and gives {given} away. "
            f"How many {item} does {name} have now?"
        )
        return record(question, start + more - given, 3)
    if kind == 1:
        boxes = rng.randint(2, 9)
        question = (
            f"{name} fills {boxes} boxes with {more} {item} each and has {start} left over. "
            f"How many {item} are there in all?"
        )
        return record(question, boxes * more + start, 3)
    friends = rng.randint(2, 6)
    each = rng.randint(2, 12)
    question = (
        f"{name} shares {friends * each} {item} equally among {friends} friends, then each "
        f"friend finds {more} more. How many {item} does each friend have?"
    )
    return record(question, each + more, 3)


def split_sets(seed: int) -> dict[str, list[dict[str, object]]]:
    """``train`` (1200) and ``test`` (150), a third per level. Level 1 has only 110 distinct
    questions: 10 go to test (each 5 times), the other 100 to train (each 4 times); the
    generated levels share no question between the sets."""
    rng = random.Random(seed)
    easy = easy_problems()
    held = set(rng.sample(range(len(easy)), 10))
    train = [r for i, r in enumerate(easy) if i not in held] * 4
    test = [r for i, r in enumerate(easy) if i in held] * 5
    seen: set[str] = set()
    for maker in (two_digit, word_problem):
        made: list[dict[str, object]] = []
        while len(made) < 450:
            item = maker(rng)
            if item["prompt"] not in seen:
                seen.add(str(item["prompt"]))
                made.append(item)
        test.extend(made[:50])
        train.extend(made[50:])
    rng.shuffle(train)
    rng.shuffle(test)
    return {"train": train, "test": test}


def as_lines(records: list[dict[str, object]]) -> list[str]:
    return [json.dumps(r, sort_keys=True, ensure_ascii=False) for r in records]


def build(seed: int) -> dict[str, list[str]]:
    sets = split_sets(seed)
    return {
        "easy.jsonl": as_lines(easy_problems()),
        "train.jsonl": as_lines(sets["train"]),
        "test.jsonl": as_lines(sets["test"]),
    }


def main(argv: list[str] | None = None) -> list[Path]:
    return generator_main(
        argv,
        description=__doc__.splitlines()[0],
        default_dir=Path(__file__).resolve().parent / "arithmetic",
        build=build,
    )


if __name__ == "__main__":
    main()
