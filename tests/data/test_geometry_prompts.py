"""The geometry multiple-choice set: deterministic generator = committed files, the answer
letter names the value among four options, every diagram loads, no test problem in train."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from PIL import Image

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def _generator():
    if str(DATASETS) not in sys.path:
        sys.path.insert(0, str(DATASETS))
    spec = importlib.util.spec_from_file_location(
        "make_geometry_prompts", DATASETS / "make_geometry_prompts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generator_is_deterministic_and_matches_the_committed_files(tmp_path: Path) -> None:
    _generator().main(["--out-dir", str(tmp_path)])
    committed = DATASETS / "geometry"
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert made == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (committed / rel).read_bytes(), f"{rel} is stale"


def test_answers_options_images_and_splits() -> None:
    from unirl.data import read_prompt_file
    from unirl.data.media import has_references

    lines = {
        split: [
            json.loads(x)
            for x in (DATASETS / "geometry" / f"{split}.jsonl").read_text().splitlines()
        ]
        for split in ("train", "test")
    }
    assert (len(lines["train"]), len(lines["test"])) == (160, 40)
    for split, rows in lines.items():
        for row in rows:
            choices = row["choices"]
            assert len(set(choices)) == 4 and all(c > 0 for c in choices)
            assert choices["ABCD".index(row["answer"])] == row["value"]
            listed = " ".join(f"{letter}. {v}" for letter, v in zip("ABCD", choices))
            assert listed in row["prompt"] and row["prompt"].endswith("in \\boxed{}.")
        examples = read_prompt_file(DATASETS / "geometry" / f"{split}.jsonl")
        assert has_references(examples)  # every line carries its diagram
        with Image.open(examples[0].media_refs[0].uri) as img:
            assert img.size == (112, 112)
    key = lambda r: (r["kind"], r["value"], tuple(sorted(r["choices"])), r["prompt"])  # noqa: E731
    assert not {r["prompt"] + str(r["choices"]) for r in lines["test"]} & {
        r["prompt"] + str(r["choices"]) for r in lines["train"]
    }
    assert len({key(r) for r in lines["train"]}) == 160
