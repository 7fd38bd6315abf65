"""Generate the general caption prompt set: styles x subjects x settings.

    python datasets/make_caption_prompts.py              # writes datasets/captions/{train,test}.txt
    python datasets/make_caption_prompts.py --out-dir /tmp/captions --seed 0

Deterministic: the same seed writes byte-identical files. Train and test prompts are disjoint.
Prompts read "<style> of <subject> <setting>", e.g. "An oil painting of a red fox in a snowy
forest at dawn".
"""

from __future__ import annotations

import random
from pathlib import Path

from prompt_io import generator_main

STYLES = (
    "A photograph",
    "A close-up photograph",
    "A wide-angle photograph",
    "A black-and-white photograph",
    "A watercolor painting",
    "An oil painting",
    "An impressionist painting",
    "A pencil sketch",
    "A charcoal drawing",
    "An ink illustration",
    "A children's book illustration",
    "A comic book panel",
    "A pixel art image",
    "A 3D render",
    "A low-poly 3D model",
    "A claymation still",
    "A cinematic film still",
    "A vintage postcard",
    "A stained glass window",
    "A paper cut-out collage",
    "A woodblock print",
    "A mosaic",
    "A minimalist vector illustration",
    "A retro 1980s poster",
    "A studio product photo",
)

SUBJECTS = (
    "a red fox",
    "an old lighthouse",
    "a bowl of ramen",
    "a vintage bicycle",
    "a sleeping cat",
    "a snowy owl",
    "a steam locomotive",
    "a robot gardener",
    "a stack of old books",
    "a hot air balloon",
    "a sailboat",
    "a golden retriever puppy",
    "a cup of cappuccino",
    "an astronaut",
    "a wooden cabin",
    "a giant sunflower",
    "a knight in armor",
    "a koi fish",
    "a vintage typewriter",
    "a mountain goat",
    "a glass teapot",
    "a dragon",
    "a street musician playing violin",
    "a pair of red sneakers",
    "a colorful parrot",
    "a windmill",
    "a sandcastle",
    "a chess board mid-game",
    "an elephant family",
    "a bonsai tree",
    "a food truck",
    "a jellyfish",
    "a grandfather clock",
    "a bowl of fresh strawberries",
    "a vintage camera",
    "a polar bear",
    "a small waterfall",
    "a lantern festival crowd",
    "a racing car",
    "a hedgehog",
    "a cathedral",
    "a basket of bread",
    "a tiger",
    "a treehouse",
    "an origami crane",
    "a tram",
    "a violinist",
    "a family of ducks",
    "a stone bridge",
    "a neon-lit arcade machine",
)

SETTINGS = (
    "in a snowy forest at dawn",
    "on a busy city street at night",
    "on a sandy beach at sunset",
    "in a sunlit meadow",
    "on a rainy afternoon",
    "inside a cozy kitchen",
    "on a misty mountain top",
    "in a desert under a starry sky",
    "next to a calm lake",
    "in a bustling market",
    "on a wooden table by a window",
    "in an abandoned factory",
    "under cherry blossoms in spring",
    "in a futuristic city",
    "on the surface of the moon",
    "in a tropical rainforest",
    "in a quiet library",
    "during a thunderstorm",
    "on a frozen lake",
    "in a field of lavender",
    "at a harbor in the early morning",
    "on a rooftop garden",
    "in a medieval village",
    "underwater near a coral reef",
    "in an autumn park with falling leaves",
    "against a plain white background",
    "in a candle-lit room",
    "on a foggy pier",
    "in a greenhouse full of plants",
    "at a night carnival",
)

NUM_TEST = 200
NUM_TRAIN = 2000


def make_prompts(seed: int) -> tuple[list[str], list[str]]:
    """Returns ``(train, test)`` prompt lines; no prompt appears in both."""
    total = len(STYLES) * len(SUBJECTS) * len(SETTINGS)
    rng = random.Random(seed)
    picks = rng.sample(range(total), NUM_TEST + NUM_TRAIN)

    def decode(index: int) -> str:
        style, rest = divmod(index, len(SUBJECTS) * len(SETTINGS))
        subject, setting = divmod(rest, len(SETTINGS))
        return f"{STYLES[style]} of {SUBJECTS[subject]} {SETTINGS[setting]}"

    lines = [decode(i) for i in picks]
    return lines[NUM_TEST:], lines[:NUM_TEST]


def main(argv: list[str] | None = None) -> list[Path]:
    return generator_main(
        argv,
        description=__doc__.splitlines()[0],
        default_dir=Path(__file__).resolve().parent / "captions",
        build=lambda seed: dict(zip(("train.txt", "test.txt"), make_prompts(seed))),
    )


if __name__ == "__main__":
    main()
