"""The committed prompt sets: generators are deterministic and match the committed files."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def _load(script: str) -> ModuleType:
    if str(DATASETS) not in sys.path:  # as when run as `python datasets/<script>.py`
        sys.path.insert(0, str(DATASETS))
    spec = importlib.util.spec_from_file_location(script, DATASETS / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATORS = {
    "make_ocr_prompts": ("ocr", ["train.txt", "test.txt"]),
    "make_caption_prompts": ("captions", ["train.txt", "test.txt"]),
    "make_tiny_prompts": ("tiny", ["prompts.txt"]),
}


@pytest.mark.parametrize("script", sorted(GENERATORS))
def test_generator_is_deterministic_and_matches_committed_files(tmp_path, script):
    module = _load(script)
    folder, files = GENERATORS[script]
    module.main(["--out-dir", str(tmp_path / "a")])
    module.main(["--out-dir", str(tmp_path / "b")])
    for name in files:
        first = (tmp_path / "a" / name).read_bytes()
        assert first == (tmp_path / "b" / name).read_bytes()
        committed = DATASETS / folder / name
        assert committed.read_bytes() == first, f"{committed} is stale: rerun datasets/{script}.py"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_ocr_prompts_have_exactly_one_quoted_target_and_disjoint_splits():
    from unirl.reward.local import extract_quoted_target, normalize_ocr_text

    splits = {name: _lines(DATASETS / "ocr" / f"{name}.txt") for name in ("train", "test")}
    assert len(splits["train"]) == 2000 and len(splits["test"]) == 200
    targets = {}
    for name, lines in splits.items():
        for line in lines:
            assert line.count('"') == 2, line
            target = extract_quoted_target(line)
            assert target and re.fullmatch(r"[A-Za-z0-9 ]{2,16}", target), line
        targets[name] = {normalize_ocr_text(extract_quoted_target(x)) for x in lines}
    assert not targets["train"] & targets["test"]
    assert len(targets["test"]) == 40


def test_caption_and_tiny_sets():
    train, test = (
        _lines(DATASETS / "captions" / "train.txt"),
        _lines(DATASETS / "captions" / "test.txt"),
    )
    assert len(train) == len(set(train)) == 2000 and len(test) == len(set(test)) == 200
    assert not set(train) & set(test)
    tiny = _lines(DATASETS / "tiny" / "prompts.txt")
    assert len(tiny) == len(set(tiny)) == 64 and all(line.startswith("a ") for line in tiny)
