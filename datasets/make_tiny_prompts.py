"""Generate the quick-start prompt set: 8 colours x 8 shapes = 64 short prompts.

    python datasets/make_tiny_prompts.py                 # writes datasets/tiny/prompts.txt

Short and colour-heavy so a tiny random text encoder sees distinct tokens and a colour /
brightness reward has something to latch onto. Deterministic (no randomness at all).
"""

from __future__ import annotations

from pathlib import Path

from prompt_io import generator_main

COLORS = ("red", "green", "blue", "yellow", "white", "black", "orange", "purple")
SHAPES = ("circle", "square", "triangle", "star", "heart", "stripe", "cloud", "moon")


def make_prompts() -> list[str]:
    """``a <colour> <shape>`` for every pair, colours outermost."""
    return [f"a {color} {shape}" for color in COLORS for shape in SHAPES]


def main(argv: list[str] | None = None) -> list[Path]:
    return generator_main(
        argv,
        description=__doc__.splitlines()[0],
        default_dir=Path(__file__).resolve().parent / "tiny",
        build=lambda seed: {"prompts.txt": make_prompts()},  # no randomness: seed unused
    )


if __name__ == "__main__":
    main()
