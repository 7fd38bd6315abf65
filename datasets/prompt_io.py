"""What every prompt-set generator shares: byte-stable writing and the command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def write_lines(path: Path, lines: list[str]) -> None:
    """One prompt per line, UTF-8, ``\\n`` endings, trailing newline: byte-identical reruns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")


def generator_main(
    argv: list[str] | None,
    *,
    description: str,
    default_dir: Path,
    build: Callable[[int], dict[str, list[str]]],
) -> list[Path]:
    """``--out-dir`` / ``--seed`` CLI: ``build(seed)`` returns ``{file name: prompts}``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out-dir", type=Path, default=default_dir)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = []
    for name, lines in build(args.seed).items():
        path = args.out_dir / name
        write_lines(path, lines)
        print(f"wrote {len(lines)} prompts to {path}")
        paths.append(path)
    return paths
