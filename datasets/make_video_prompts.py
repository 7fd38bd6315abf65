"""Generate the video prompt sets: short motion prompts, and first frames with a motion.

    python datasets/make_video_prompts.py     # writes datasets/video/{t2v.txt,i2v.jsonl} + PNGs

``t2v.txt``: 64 prompts ``a(n) <colour> <shape> <motion>`` from the quick-start vocabulary
(``make_tiny_prompts.py``'s colours and shapes) and eight motions, for text-to-video.

``i2v.jsonl``: 48 image-to-video prompts. Each first frame is a 32x48 (height x width, the
tiny Wan presets' test size, a multiple of 16 as Wan needs) scene rendered here: a plain
background and one coloured square or disc, as a ``media`` reference of role ``reference``
(``unirl.data.media`` reads it; the trainer resizes it to the sampled size and hands it to
``bundle.encode_references`` as the video's first frame); the prompt names the shape and a
motion ("the red disc drifts to the left"). Deterministic (``random.Random(seed)``); no two
lines share a scene.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from make_tiny_prompts import COLORS as TINY_COLORS
from make_tiny_prompts import SHAPES as TINY_SHAPES
from PIL import Image, ImageDraw
from prompt_io import write_lines

HEIGHT, WIDTH = 32, 48
MOTIONS = (
    "moving left",
    "moving right",
    "rising slowly",
    "falling down",
    "spinning in place",
    "growing larger",
    "shrinking away",
    "pulsing gently",
)
T2V_COUNT = 64
I2V_COUNT = 48

# first frames: the shape colours of the editing set, on light and dark backdrops
RGB = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (240, 210, 40),
    "white": (245, 245, 245),
    "orange": (245, 140, 20),
    "purple": (140, 50, 180),
}
BACKGROUNDS = {"paper": (235, 232, 225), "mist": (205, 215, 225), "night": (30, 30, 45)}
SHAPES = ("square", "disc")
I2V_MOTIONS = {
    "left": "the {color} {shape} drifts to the left",
    "right": "the {color} {shape} drifts to the right",
    "up": "the {color} {shape} floats upward",
    "down": "the {color} {shape} sinks down",
    "grow": "the {color} {shape} slowly grows",
    "fade": "the {color} {shape} fades away",
}


def t2v_prompts(seed: int) -> list[str]:
    """``T2V_COUNT`` distinct ``a(n) <colour> <shape> <motion>`` prompts in a seeded order."""
    rng = random.Random(seed)
    every = [
        f"{'an' if c[0] in 'aeiou' else 'a'} {c} {s} {m}"
        for c in TINY_COLORS
        for s in TINY_SHAPES
        for m in MOTIONS
    ]
    return rng.sample(every, T2V_COUNT)


def i2v_scene(rng: random.Random) -> dict:
    """One first frame: backdrop, shape, colour, box in pixels, and the motion."""
    side = rng.randrange(10, 17)
    x0 = rng.randrange(2, WIDTH - side - 1)
    y0 = rng.randrange(2, HEIGHT - side - 1)
    return {
        "background": rng.choice(sorted(BACKGROUNDS)),
        "shape": rng.choice(SHAPES),
        "color": rng.choice(sorted(RGB)),
        "box": (x0, y0, x0 + side, y0 + side),
        "motion": rng.choice(sorted(I2V_MOTIONS)),
    }


def render(scene: dict) -> Image.Image:
    image = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUNDS[scene["background"]])
    draw = ImageDraw.Draw(image)
    x0, y0, x1, y1 = scene["box"]
    box = (x0, y0, x1 - 1, y1 - 1)
    if scene["shape"] == "square":
        draw.rectangle(box, fill=RGB[scene["color"]])
    else:
        draw.ellipse(box, fill=RGB[scene["color"]])
    return image


def i2v_rows(seed: int) -> list[tuple[dict, Image.Image]]:
    """``I2V_COUNT`` (json line, first frame) pairs, no scene twice."""
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[tuple[dict, Image.Image]] = []
    while len(rows) < I2V_COUNT:
        s = i2v_scene(rng)
        key = json.dumps([s["background"], s["shape"], s["color"], s["box"]])
        if key in seen:
            continue
        seen.add(key)
        name = f"i2v_{len(rows):04d}.png"
        line = {
            "prompt": I2V_MOTIONS[s["motion"]].format(color=s["color"], shape=s["shape"]),
            "media": [{"modality": "image", "role": "reference", "uri": f"images/{name}"}],
            "motion": s["motion"],
        }
        rows.append((line, render(s)))
    return rows


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "video")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    t2v = args.out_dir / "t2v.txt"
    write_lines(t2v, t2v_prompts(args.seed))
    print(f"wrote {T2V_COUNT} prompts to {t2v}")
    rows = i2v_rows(args.seed)
    (args.out_dir / "images").mkdir(parents=True, exist_ok=True)
    for line, frame in rows:
        frame.save(args.out_dir / line["media"][0]["uri"])
    i2v = args.out_dir / "i2v.jsonl"
    write_lines(i2v, [json.dumps(line, sort_keys=True) for line, _ in rows])
    print(f"wrote {I2V_COUNT} first frames and motions to {i2v}")
    return [t2v, i2v]


if __name__ == "__main__":
    main()
