"""Generate the geometry multiple-choice set (geo3k-shaped): rendered diagrams, a question,
four options and the option letter.

    python datasets/make_geometry_prompts.py   # writes datasets/geometry/{train,test}.jsonl + PNGs

Each diagram is a 112x112 greyscale PNG drawn with PIL (lines, arcs and labels in the default
font): a triangle with two angles given ("find x", the third angle), a straight angle split
in two, a rectangle with its sides (area or perimeter), a right triangle with legs from a
Pythagorean triple (the hypotenuse) or a circle with its radius (the diameter). The prompt
holds the question, the options "A. .. B. .. C. .. D. .." and asks for the letter in
``\\boxed{}``; ``answer`` is the letter, ``value`` the number, and the diagram is the line's
``media`` image (role ``condition``). Deterministic (``random.Random(seed)``); no test
problem (kind and numbers) appears in train.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from prompt_io import write_lines

SIZE = 112
LETTERS = "ABCD"
INSTRUCTION = "Answer with the option letter in \\boxed{}."
SPLITS = {"train": 160, "test": 40}


def _font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=12)


def _label(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str) -> None:
    draw.text(xy, text, fill=0, font=_font(), anchor="mm")


def triangle_angles(rng: random.Random) -> tuple[dict, Image.Image]:
    a, b = rng.randrange(30, 85, 5), rng.randrange(30, 85, 5)
    img = Image.new("L", (SIZE, SIZE), 255)
    d = ImageDraw.Draw(img)
    p, q, r = (14, 94), (98, 94), (rng.randint(35, 77), 18)
    d.polygon([p, q, r], outline=0, width=2)
    _label(d, (p[0] + 14, p[1] - 8), f"{a}°")
    _label(d, (q[0] - 14, q[1] - 8), f"{b}°")
    _label(d, (r[0], r[1] + 16), "x")
    return {
        "kind": "triangle_angles",
        "numbers": [a, b],
        "value": 180 - a - b,
        "question": "In the triangle, two angles are given. Find x in degrees.",
    }, img


def straight_angle(rng: random.Random) -> tuple[dict, Image.Image]:
    a = rng.randrange(20, 161)
    img = Image.new("L", (SIZE, SIZE), 255)
    d = ImageDraw.Draw(img)
    o = (56, 78)
    d.line([(8, o[1]), (104, o[1])], fill=0, width=2)
    ray = (o[0] + 44 * math.cos(math.radians(a)), o[1] - 44 * math.sin(math.radians(a)))
    d.line([o, ray], fill=0, width=2)
    mid_a, mid_x = math.radians(a / 2), math.radians((180 + a) / 2)
    _label(d, (o[0] + 22 * math.cos(mid_a), o[1] - 22 * math.sin(mid_a)), f"{a}°")
    _label(d, (o[0] + 22 * math.cos(mid_x), o[1] - 22 * math.sin(mid_x)), "x")
    return {
        "kind": "straight_angle",
        "numbers": [a],
        "value": 180 - a,
        "question": "The two angles lie on a straight line. Find x in degrees.",
    }, img


def rectangle(rng: random.Random) -> tuple[dict, Image.Image]:
    w, h = rng.randint(2, 12), rng.randint(2, 12)
    area = rng.random() < 0.5
    img = Image.new("L", (SIZE, SIZE), 255)
    d = ImageDraw.Draw(img)
    d.rectangle([20, 30, 92, 82], outline=0, width=2)
    _label(d, (56, 20), str(w))
    _label(d, (102, 56), str(h))
    question = f"Find the {'area' if area else 'perimeter'} of the rectangle."
    return {
        "kind": "rectangle_" + ("area" if area else "perimeter"),
        "numbers": [w, h],
        "value": w * h if area else 2 * (w + h),
        "question": question,
    }, img


def right_triangle(rng: random.Random) -> tuple[dict, Image.Image]:
    base = rng.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25)])
    k = rng.randint(1, 8)
    a, b, c = (k * v for v in base)
    if rng.random() < 0.5:  # which leg stands up
        a, b = b, a
    img = Image.new("L", (SIZE, SIZE), 255)
    d = ImageDraw.Draw(img)
    p, q, r = (18, 92), (96, 92), (18, 20)
    d.polygon([p, q, r], outline=0, width=2)
    d.rectangle([18, 82, 28, 92], outline=0, width=1)
    _label(d, (57, 102), str(b))
    _label(d, (9, 56), str(a))
    _label(d, (64, 50), "c")
    return {
        "kind": "right_triangle",
        "numbers": [a, b],
        "value": c,
        "question": "The triangle has a right angle. Find the hypotenuse c.",
    }, img


def circle(rng: random.Random) -> tuple[dict, Image.Image]:
    r = rng.randint(2, 99)
    img = Image.new("L", (SIZE, SIZE), 255)
    d = ImageDraw.Draw(img)
    d.ellipse([16, 16, 96, 96], outline=0, width=2)
    d.line([(56, 56), (96, 56)], fill=0, width=2)
    d.ellipse([53, 53, 59, 59], fill=0)
    _label(d, (76, 46), str(r))
    return {
        "kind": "circle",
        "numbers": [r],
        "value": 2 * r,
        "question": "The radius of the circle is given. Find its diameter.",
    }, img


KINDS = (triangle_angles, straight_angle, rectangle, right_triangle, circle)


def options(rng: random.Random, value: int) -> tuple[list[int], str]:
    """Four distinct positive options, the value among them; its letter."""
    picks = {value}
    while len(picks) < 4:
        delta = rng.choice([-20, -10, -6, -4, -2, -1, 1, 2, 4, 6, 10, 20])
        if value + delta > 0:
            picks.add(value + delta)
    order = sorted(picks)
    rng.shuffle(order)
    return order, LETTERS[order.index(value)]


def build(seed: int) -> dict[str, list[tuple[dict, Image.Image]]]:
    rng = random.Random(seed)
    seen: set[tuple] = set()
    out: dict[str, list[tuple[dict, Image.Image]]] = {}
    for split in ("test", "train"):  # test first: train never repeats a test problem
        rows: list[tuple[dict, Image.Image]] = []
        misses = 0
        while len(rows) < SPLITS[split]:
            problem, img = KINDS[len(rows) % len(KINDS)](rng)
            key = (problem["kind"], *problem["numbers"])
            if key in seen:
                misses += 1
                if misses > 10_000:
                    raise RuntimeError(f"too few distinct {problem['kind']} problems")
                continue
            seen.add(key)
            choice_values, letter = options(rng, problem["value"])
            listed = " ".join(f"{LETTERS[i]}. {v}" for i, v in enumerate(choice_values))
            name = f"images/{split}_{len(rows):04d}.png"
            line = {
                "prompt": f"{problem['question']}\nChoices: {listed}\n{INSTRUCTION}",
                "answer": letter,
                "value": problem["value"],
                "kind": problem["kind"],
                "choices": choice_values,
                "media": [{"modality": "image", "role": "condition", "uri": name}],
            }
            rows.append((line, img))
        out[split] = rows
    return out


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-dir", type=Path, default=Path(__file__).resolve().parent / "geometry"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    (args.out_dir / "images").mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rows in build(args.seed).items():
        for line, img in rows:
            img.save(args.out_dir / line["media"][0]["uri"], optimize=True)
        path = args.out_dir / f"{split}.jsonl"
        write_lines(path, [json.dumps(line, sort_keys=True) for line, _ in rows])
        print(f"wrote {len(rows)} problems to {path}")
        paths.append(path)
    return paths


if __name__ == "__main__":
    main()
