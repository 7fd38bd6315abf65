"""Generate the quick-start prompt set: 8 colours x 8 shapes = 64 short prompts.

    python datasets/make_tiny_prompts.py                 # writes datasets/tiny/prompts.txt

Short and colour-heavy so a tiny random text encoder sees distinct tokens and a colour /
brightness reward has something to latch onto. Deterministic (no randomness at all).
"""

from __future__ import annotations

import argparse
from pathlib import Path

COLORS = ("red", "green", "blue", "yellow", "white", "black", "orange", "purple")
SHAPES = ("circle", "square", "triangle", "star", "heart", "stripe", "cloud", "moon")


def make_prompts() -> list[str]:
    """``a <colour> <shape>`` for every pair, colours outermost."""
    return [f"a {color} {shape}" for color in COLORS for shape in SHAPES]


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "tiny")
    args = parser.parse_args(argv)
    path = args.out_dir / "prompts.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = make_prompts()
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} prompts to {path}")
    return [path]


if __name__ == "__main__":
    main()
