"""The arithmetic sets: deterministic generator = committed files, answers right, splits apart."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

DATASETS = Path(__file__).resolve().parents[2] / "datasets"
FILES = ("easy.jsonl", "train.jsonl", "test.jsonl")


def _generator():
    if str(DATASETS) not in sys.path:  # as when run as `python datasets/<script>.py`
        sys.path.insert(0, str(DATASETS))
    spec = importlib.util.spec_from_file_location(
        "make_arithmetic_prompts", DATASETS / "make_arithmetic_prompts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_generator_is_deterministic_and_matches_the_committed_files(tmp_path: Path) -> None:
    module = _generator()
    module.main(["--out-dir", str(tmp_path / "a")])
    module.main(["--out-dir", str(tmp_path / "b")])
    for name in FILES:
        first = (tmp_path / "a" / name).read_bytes()
        assert first == (tmp_path / "b" / name).read_bytes()
        committed = DATASETS / "arithmetic" / name
        assert committed.read_bytes() == first, f"{committed} is stale: rerun the generator"


def _expected(prompt: str) -> int:
    """The answer recomputed from the question text."""
    if m := re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\? .*", prompt):
        a, op, b = int(m[1]), m[2], int(m[3])
        return a + b if op == "+" else a - b if op == "-" else a * b
    if m := re.search(r"has (\d+) \w+, buys (\d+) more and gives (\d+) away", prompt):
        return int(m[1]) + int(m[2]) - int(m[3])
    if m := re.search(r"fills (\d+) boxes with (\d+) \w+ each and has (\d+) left", prompt):
        return int(m[1]) * int(m[2]) + int(m[3])
    m = re.search(r"shares (\d+) \w+ equally among (\d+) friends.*finds (\d+) more", prompt)
    assert m, prompt
    assert int(m[1]) % int(m[2]) == 0
    return int(m[1]) // int(m[2]) + int(m[3])


def test_answers_are_right_and_every_prompt_asks_for_a_box() -> None:
    from unirl.data import read_prompt_file

    for name in FILES:
        examples = read_prompt_file(DATASETS / "arithmetic" / name)
        for ex in examples:
            assert ex.prompt.endswith("Put the final answer in \\boxed{}.")
            assert ex.metadata["answer"] == str(_expected(ex.prompt)), ex.prompt
            assert int(ex.metadata["answer"]) >= 0


def test_sizes_levels_and_disjoint_generated_questions() -> None:
    easy = _records(DATASETS / "arithmetic" / "easy.jsonl")
    train = _records(DATASETS / "arithmetic" / "train.jsonl")
    test = _records(DATASETS / "arithmetic" / "test.jsonl")
    assert len(easy) == 110 and all(len(r["answer"]) == 1 for r in easy)
    assert (len(train), len(test)) == (1200, 150)
    for records, per_level in ((train, 400), (test, 50)):
        assert [sum(r["level"] == lv for r in records) for lv in (1, 2, 3)] == [per_level] * 3
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
