"""Seeded vision-language prompts for the Qwen2.5-VL GRPO benchmark (geo3k-like: one diagram
per prompt, a question of a fixed token length), generated here: nothing downloaded.

    python examples/benchmarks/make_vl_prompts.py --out /tmp/bench/vl_prompts.jsonl \
        [--preset qwen2.5-vl-3b-arch] [--tokens 128] [--count 8] [--image-size 448] [--seed 0]

Writes ``--count`` JSON lines ``{"prompt": ..., "answer": "0", "media": [{"modality":
"image", "role": "condition", "uri": <absolute path>}]}`` (``PromptFileSource``'s format, as
``datasets/geometry``) and one PNG per line under ``<out dir>/<out stem>_images/``. Each prompt text is
exactly ``--tokens`` tokens as the Qwen2.5-VL bundle of ``--preset`` tokenizes it (the text
alone; the chat turn and the image placeholders come on top, the same on both sides of the
benchmark: the printed ``prompt_tokens_per_sample`` is the whole prompt as the model reads it). Each image is ``--image-size`` square, RGB, drawn from ``--seed`` and the line's
index: random polygons, segments and circles on a white page, like a geometry diagram. The
image is saved at the bundle's size, so our side's resize is the identity and TRL's
``Qwen2VLImageProcessor`` (no resize at a multiple of 28 within its pixel bounds) reads the
same pixels.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository
sys.path.insert(0, str(HERE))  # make_fixed_prompts


def vl_formatter(preset: str, image_size: int) -> Any:
    """The prompt formatter (and tokenizer) the ``QwenVLBundle`` of ``preset`` encodes prompts
    with, chat template on (the arch presets borrow the tiny tokenizer, built in memory)."""
    from unirl.models.qwen_vl import QwenVLBundle

    block = {"path": preset, "chat_template": True, "image_size": image_size}
    return QwenVLBundle.prompt_formatter(block)


def diagram(size: int, seed: int) -> Any:
    """A white ``size`` x ``size`` RGB page with seeded polygons, segments and circles."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)

    def point() -> tuple[int, int]:
        return rng.randrange(size), rng.randrange(size)

    def colour() -> tuple[int, int, int]:
        return rng.randrange(200), rng.randrange(200), rng.randrange(200)

    width = max(1, size // 150)
    for _ in range(3):
        draw.polygon([point() for _ in range(rng.randint(3, 5))], outline=colour(), width=width)
    for _ in range(4):
        draw.line([point(), point()], fill=colour(), width=width)
    for _ in range(2):
        (x, y), r = point(), rng.randrange(size // 16, size // 4)
        draw.ellipse([x - r, y - r, x + r, y + r], outline=colour(), width=width)
    return image


def main(argv: list[str] | None = None) -> int:
    from make_fixed_prompts import count_tokens, fixed_length_prompt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="qwen2.5-vl-3b-arch")
    parser.add_argument("--tokens", type=int, default=128, help="tokens of each prompt's text")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.count < 1:
        parser.error("--tokens and --count must be >= 1")
    if args.image_size < 28 or args.image_size % 28:
        parser.error(f"--image-size {args.image_size} must be a positive multiple of 28")
    formatter = vl_formatter(args.preset, args.image_size)
    tokenizer = formatter.tokenizer
    texts = [fixed_length_prompt(tokenizer, args.tokens, seed) for seed in range(args.count)]
    lengths = {count_tokens(tokenizer, t) for t in texts}
    if lengths != {args.tokens} or len(set(texts)) != len(texts):
        raise SystemExit(f"prompt lengths {sorted(lengths)} != {args.tokens} or repeated prompts")
    # what the model reads: the chat turn, the image's placeholders and the text
    encoded = {len(ids) for ids in formatter.encode_prompts(texts)}
    if len(encoded) != 1:
        raise SystemExit(f"encoded prompt lengths differ: {sorted(encoded)}")
    out = args.out.resolve()
    images = out.parent / f"{out.stem}_images"
    images.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            path = images / f"diagram_{i:03d}.png"
            diagram(args.image_size, args.seed * 100_003 + i).save(path)
            media = [{"modality": "image", "role": "condition", "uri": str(path)}]
            f.write(json.dumps({"prompt": text, "answer": "0", "media": media}) + "\n")
    summary = {
        "prompts": str(out),
        "count": len(texts),
        "text_tokens_per_prompt": args.tokens,
        "prompt_tokens_per_sample": encoded.pop(),
        "image_size": args.image_size,
        "preset": args.preset,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
