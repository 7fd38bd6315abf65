"""Generate the image-editing set: rendered source scenes, an instruction, a mask and a box.

    python datasets/make_edit_prompts.py      # writes datasets/edit/{train,test}.jsonl + PNGs

Each source is a 64x64 scene (a plain light background and one coloured square or disc); the
instruction asks to recolour the shape ("make the red square blue"). Every line carries the
source as a ``media`` reference, the edit region as ``edit_box`` ([x0, y0, x1, y1] in
fractions of width / height: the shape's bounding box), the wanted colour as
``target_color`` ([r, g, b] in [0, 1]) and a mask PNG (white inside the region) as a
``media`` entry of role ``mask``; ``unirl.reward.local.SourcePreservation`` and ``RegionColorTarget`` score
against them. Deterministic (``random.Random(seed)``); ``test`` scenes never repeat a
``train`` scene.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw
from prompt_io import write_lines

SIZE = 64
COLORS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 210, 40),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "orange": (245, 140, 20),
    "purple": (140, 50, 180),
}
# light backdrops: keeping them is a brightness-like target a tiny random decoder can learn
BACKGROUNDS = {"paper": (235, 232, 225), "beige": (225, 210, 180), "mist": (205, 215, 225)}
SHAPES = ("square", "disc")
TEMPLATES = (
    "make the {old} {shape} {new}",
    "turn the {old} {shape} {new}",
    "recolour the {old} {shape} to {new}",
    "paint the {old} {shape} {new}",
)
SPLITS = {"train": 48, "test": 16}


def scene(rng: random.Random) -> dict:
    """One scene: background, shape, its colour, its box in pixels, and the edit."""
    old, new = rng.sample(sorted(COLORS), 2)
    side = rng.randrange(20, 33)
    x0, y0 = rng.randrange(4, SIZE - side - 3), rng.randrange(4, SIZE - side - 3)
    return {
        "background": rng.choice(sorted(BACKGROUNDS)),
        "shape": rng.choice(SHAPES),
        "old": old,
        "new": new,
        "box": (x0, y0, x0 + side, y0 + side),
        "template": rng.choice(TEMPLATES),
    }


def render(s: dict) -> tuple[Image.Image, Image.Image]:
    """The source image and its mask (white on the shape's bounding box)."""
    image = Image.new("RGB", (SIZE, SIZE), BACKGROUNDS[s["background"]])
    draw = ImageDraw.Draw(image)
    x0, y0, x1, y1 = s["box"]
    if s["shape"] == "square":
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=COLORS[s["old"]])
    else:
        draw.ellipse((x0, y0, x1 - 1, y1 - 1), fill=COLORS[s["old"]])
    mask = Image.new("L", (SIZE, SIZE), 0)
    ImageDraw.Draw(mask).rectangle((x0, y0, x1 - 1, y1 - 1), fill=255)
    return image, mask


def build(seed: int) -> dict[str, list[tuple[dict, Image.Image, Image.Image]]]:
    """``{split: [(json line, source, mask)]}`` with no scene in two splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[tuple[dict, Image.Image, Image.Image]]] = {}
    for split, count in SPLITS.items():
        rows = []
        while len(rows) < count:
            s = scene(rng)
            key = json.dumps([s["background"], s["shape"], s["old"], s["new"], s["box"]])
            if key in seen:
                continue
            seen.add(key)
            name = f"{split}_{len(rows):04d}.png"
            x0, y0, x1, y1 = s["box"]
            line = {
                "prompt": s["template"].format(old=s["old"], shape=s["shape"], new=s["new"]),
                "media": [
                    {"modality": "image", "role": "reference", "uri": f"images/{name}"},
                    {"modality": "image", "role": "mask", "uri": f"masks/{name}"},
                ],
                "edit_box": [x0 / SIZE, y0 / SIZE, x1 / SIZE, y1 / SIZE],
                "target_color": [round(c / 255, 4) for c in COLORS[s["new"]]],
            }
            rows.append((line, *render(s)))
        out[split] = rows
    return out


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "edit")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = []
    for split, rows in build(args.seed).items():
        for sub in ("images", "masks"):
            (args.out_dir / sub).mkdir(parents=True, exist_ok=True)
        for line, source, mask in rows:
            source.save(args.out_dir / line["media"][0]["uri"])
            mask.save(args.out_dir / line["media"][1]["uri"])
        path = args.out_dir / f"{split}.jsonl"
        write_lines(path, [json.dumps(line, sort_keys=True) for line, _, _ in rows])
        print(f"wrote {len(rows)} edits to {path}")
        paths.append(path)
    return paths


if __name__ == "__main__":
    main()
