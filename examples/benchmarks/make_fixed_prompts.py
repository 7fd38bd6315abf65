"""Prompts of an exact token length, for benchmarks that compare frameworks at equal shapes.

    python examples/benchmarks/make_fixed_prompts.py --tokens 128 --count 8 \
        --out /tmp/bench/prompts.jsonl [--preset qwen3-4b-arch]

Writes ``--count`` JSON lines ``{"prompt": ..., "answer": "0"}`` (``PromptFileSource``'s
format), each exactly ``--tokens`` tokens long as the Qwen3 bundle of ``--preset`` tokenizes
it with ``chat_template: false`` (the raw text, nothing added). Each prompt is different (its
own seeded word sequence); lengths are checked before writing, also with the tokenizer's
default ``add_special_tokens=True`` (what TRL calls). Another framework gets the same
tokenizer from :func:`bundle_tokenizer` (``trl_grpo_compare.py`` imports it), not from a
saved folder: transformers' ``Qwen2Tokenizer`` rebuilds its pre-tokenizer when it loads one,
and the in-memory tokenizer the ``*-arch`` presets use would then split text differently.

The ``*-arch`` presets borrow a tokenizer trained locally, so build the prompts on the machine
that runs the benchmark.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

_WORD_TEXT = """
the a of to and in is that for it as was with be by on not he this are or his from
at which but have an they you were her she there been one all we their has would
when if so no what up out who them some could then into more time two other these
than only number sum apple train river seven twelve eleven blue green red box count
add subtract multiply divide answer question value total each many how much left
right half double
"""
WORDS = tuple(_WORD_TEXT.split())


def bundle_tokenizer(preset: str) -> Any:
    """The tokenizer the Qwen3 bundle of ``preset`` samples and trains with (for an
    ``*-arch`` preset, the tiny preset's), through the bundle's own prompt formatter."""
    from unirl.models.qwen3 import Qwen3Bundle

    make = getattr(Qwen3Bundle, "prompt_formatter", None)
    if make is None:
        raise SystemExit(
            "unirl.models.qwen3.Qwen3Bundle has no prompt_formatter(block): this script needs "
            "the bundle's own tokenizer path (unirl/models/common_ar/bundle.py)"
        )
    return make({"path": preset, "chat_template": False}).tokenizer


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def fixed_length_prompt(tokenizer: Any, n_tokens: int, seed: int) -> str:
    """A word sequence of exactly ``n_tokens`` tokens: words are appended (in a seeded
    order) while they fit; the pre-tokenizer splits at spaces, so appending never shortens
    what is already there."""
    rng = random.Random(seed)
    text = f"Problem {seed}:"
    if count_tokens(tokenizer, text) > n_tokens:
        raise SystemExit(f"--tokens {n_tokens} is too short for a prompt header")
    fillers = [str(d) for d in range(10)] + list("abcdefghijklmnopqrstuvwxyz.,")
    while (have := count_tokens(tokenizer, text)) < n_tokens:
        candidates = rng.sample(WORDS, len(WORDS)) + fillers
        for word in candidates:
            for joined in (f"{text} {word}", f"{text}{word}"):
                if have < count_tokens(tokenizer, joined) <= n_tokens:
                    text = joined
                    break
            else:
                continue
            break
        else:
            raise SystemExit(
                f"no word fits the last {n_tokens - have} token(s) of prompt {seed}; "
                "try another --tokens"
            )
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="qwen3-4b-arch")
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.count < 1:
        parser.error("--tokens and --count must be >= 1")
    tokenizer = bundle_tokenizer(args.preset)
    prompts = [fixed_length_prompt(tokenizer, args.tokens, seed) for seed in range(args.count)]
    lengths = {len(tokenizer(p).input_ids) for p in prompts}
    lengths |= {count_tokens(tokenizer, p) for p in prompts}
    if lengths != {args.tokens} or len(set(prompts)) != len(prompts):
        raise SystemExit(f"prompt lengths {sorted(lengths)} != {args.tokens} or repeated prompts")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p, "answer": "0"}) + "\n")
    print(
        json.dumps(
            {
                "prompts": str(args.out),
                "count": len(prompts),
                "tokens_per_prompt": args.tokens,
                "preset": args.preset,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
