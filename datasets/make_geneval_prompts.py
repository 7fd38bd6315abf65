"""Generate GenEval-style prompt sets in the benchmark's metadata format.

    python datasets/make_geneval_prompts.py     # writes datasets/geneval/*.jsonl

- ``evaluation_metadata.jsonl`` (553): the benchmark's task mix (80 single object, 99 two
  object, 80 counting, 94 colours, 100 position, 100 colour attribution) over the 80 COCO
  classes, one JSON record per line: ``{"tag", "include", "exclude"?, "prompt"}``.
- ``train.jsonl`` (2000): more records, no prompt shared with the evaluation set: 500 two
  object, 120 counting, 400 colours, 500 position, 480 colour attribution (no single object:
  all 80 are in the evaluation set). Flow-GRPO trains on generated GenEval-style prompts and
  evaluates on the benchmark's set.
- ``blobs_train.jsonl`` / ``blobs_test.jsonl``: the CPU quick-start for the deterministic blob
  detector naming regions ``<colour> blob``. Train: ``a photo of a red blob`` (single object,
  16 lines: one direction a tiny model can learn in minutes). Test: ``a photo of a <colour>
  blob`` and ``a photo of a <colour> blob and a <colour> blob`` over red, green, blue, yellow.

Our own seeded draws (``random.Random(seed)``), not the released file: same format and task
sizes, different object choices. Byte-identical on every run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prompt_io import generator_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unirl.reward.local.geneval.prompts import TASK_SIZES, make_prompt_set

BLOB_COLOURS = ("red", "green", "blue", "yellow")
TRAIN_SIZES = {
    "two_object": 500,
    "counting": 120,
    "colors": 400,
    "position": 500,
    "color_attr": 480,
}


def _lines(records: list[dict]) -> list[str]:
    return [json.dumps(r, sort_keys=True) for r in records]


def blob_records(repeats: int) -> list[dict]:
    """``repeats`` copies of one single-object record per blob colour and one two-object
    record per pair of colours."""
    names = [f"{colour} blob" for colour in BLOB_COLOURS]
    records = [
        {
            "tag": "single_object",
            "include": [{"class": n, "count": 1}],
            "prompt": f"a photo of a {n}",
        }
        for n in names
    ]
    records += [
        {
            "tag": "two_object",
            "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
            "prompt": f"a photo of a {a} and a {b}",
        }
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]
    return records * repeats


def build(seed: int) -> dict[str, list[str]]:
    evaluation = make_prompt_set(seed, sizes=TASK_SIZES)
    held = {r["prompt"] for r in evaluation}
    train = make_prompt_set(seed + 1, sizes=TRAIN_SIZES, exclude=held)
    return {
        "evaluation_metadata.jsonl": _lines(evaluation),
        "train.jsonl": _lines(train),
        "blobs_train.jsonl": _lines(blob_records(1)[:1] * 16),
        "blobs_test.jsonl": _lines(blob_records(1)),
    }


def main(argv: list[str] | None = None) -> list[Path]:
    return generator_main(
        argv,
        description=__doc__.splitlines()[0],
        default_dir=Path(__file__).resolve().parent / "geneval",
        build=build,
    )


if __name__ == "__main__":
    main()
