"""GenEval-style prompt sets in the benchmark's metadata format: one JSON object per line,
``{"tag", "include": [{"class", "count"[, "color"][, "position"]}], "exclude"?, "prompt"}``.

Templates (the benchmark's wording): ``a photo of a/an <object>``; ``... of a <A> and a <B>``;
``a photo of <two|three|four> <objects>`` (include ``count`` n, exclude ``count`` n + 1);
``a photo of a <colour> <object>``; ``a photo of a <A> <relation> a <B>`` (include ``B``,
then ``A`` with ``position: [relation, 0]``); ``a photo of a <c1> <A> and a <c2> <B>``.
Objects are the 80 COCO classes. The draws are ours (seeded), not the released
``evaluation_metadata.jsonl``: same task mix and sizes, different object pairs.
"""

from __future__ import annotations

import random

from unirl.reward.local.geneval.rules import COLORS, RELATIONS

COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
"""COCO's 80 detection classes in the detector's label order (mmdet / Detectron2)."""

TASK_SIZES = {
    "single_object": 80,
    "two_object": 99,
    "counting": 80,
    "colors": 94,
    "position": 100,
    "color_attr": 100,
}
"""Prompts per task in the released benchmark (553 in all)."""

NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}

_PLURAL_SAME = {"sheep", "skis", "scissors"}
_PLURAL_IRREGULAR = {"person": "people", "mouse": "mice", "knife": "knives"}


def article(noun: str) -> str:
    """``a`` or ``an`` by the first letter."""
    return "an" if noun[0] in "aeiou" else "a"


def plural(noun: str) -> str:
    """English plural of a class name (its last word)."""
    head, _, last = noun.rpartition(" ")
    if last in _PLURAL_SAME:
        word = last
    elif last in _PLURAL_IRREGULAR:
        word = _PLURAL_IRREGULAR[last]
    elif last.endswith(("s", "x", "ch", "sh")):
        word = last + "es"
    elif last.endswith("y") and last[-2] not in "aeiou":
        word = last[:-1] + "ies"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


def _one(name: str, **extra: object) -> dict[str, object]:
    return {"class": name, "count": 1, **extra}


def make_record(tag: str, rng: random.Random, classes: tuple[str, ...]) -> dict[str, object]:
    """One random record of ``tag`` over ``classes``."""
    if tag == "single_object":
        obj = rng.choice(classes)
        return {"tag": tag, "include": [_one(obj)], "prompt": f"a photo of {article(obj)} {obj}"}
    if tag == "two_object":
        a, b = rng.sample(classes, 2)
        prompt = f"a photo of {article(a)} {a} and {article(b)} {b}"
        return {"tag": tag, "include": [_one(a), _one(b)], "prompt": prompt}
    if tag == "counting":
        obj, n = rng.choice(classes), rng.choice(sorted(NUMBER_WORDS))
        return {
            "tag": tag,
            "include": [{"class": obj, "count": n}],
            "exclude": [{"class": obj, "count": n + 1}],
            "prompt": f"a photo of {NUMBER_WORDS[n]} {plural(obj)}",
        }
    if tag == "colors":
        obj, colour = rng.choice(classes), rng.choice(COLORS)
        prompt = f"a photo of {article(colour)} {colour} {obj}"
        return {"tag": tag, "include": [_one(obj, color=colour)], "prompt": prompt}
    if tag == "position":
        a, b = rng.sample(classes, 2)
        relation = rng.choice(RELATIONS)
        return {
            "tag": tag,
            "include": [_one(b), _one(a, position=[relation, 0])],
            "prompt": f"a photo of {article(a)} {a} {relation} {article(b)} {b}",
        }
    if tag == "color_attr":
        a, b = rng.sample(classes, 2)
        ca, cb = rng.sample(COLORS, 2)
        return {
            "tag": tag,
            "include": [_one(a, color=ca), _one(b, color=cb)],
            "prompt": f"a photo of {article(ca)} {ca} {a} and {article(cb)} {cb} {b}",
        }
    raise ValueError(f"unknown GenEval tag {tag!r}")


def make_prompt_set(
    seed: int = 0,
    sizes: dict[str, int] | None = None,
    classes: tuple[str, ...] = COCO_CLASSES,
    exclude: set[str] | None = None,
) -> list[dict[str, object]]:
    """Records for every task (``sizes`` per tag, default :data:`TASK_SIZES`), distinct
    prompts within the set and none of ``exclude``, deterministic for a seed. Ask for no
    more prompts than a task has (80 single objects, 240 counts, 800 colours)."""
    rng = random.Random(seed)
    records: list[dict[str, object]] = []
    seen: set[str] = set(exclude or ())
    for tag, size in (sizes or TASK_SIZES).items():
        made = 0
        while made < size:
            record = make_record(tag, rng, classes)
            if record["prompt"] in seen:
                continue
            seen.add(str(record["prompt"]))  # make_record writes the prompt as a str
            records.append(record)
            made += 1
    return records
