"""``python -m unirl.reward.local.geneval --images DIR``: GenEval's per-task table for a folder
in the benchmark's output layout (``DIR/<index>/metadata.jsonl`` with one record,
``DIR/<index>/samples/*.png``), as the paper prints it. ``--detector blob`` uses the
deterministic blob detector and mean-colour classifier (no weights); the default is
Mask2Former + CLIP (``--detector-model``, ``--clip-model``: folders or hub ids)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from unirl.reward.local.geneval.detectors import (
    CLIPColourClassifier,
    ColourBlobDetector,
    Mask2FormerDetector,
    MeanColourClassifier,
)
from unirl.reward.local.geneval.rules import TASKS, check_metadata, format_table, task_table
from unirl.reward.local.geneval.scorer import GenEval


def read_folder(root: Path) -> list[tuple[dict, list[Path]]]:
    """``(metadata, image paths)`` per prompt folder, in folder-name order."""
    entries = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        meta_path = folder / "metadata.jsonl"
        if not meta_path.is_file():
            raise SystemExit(f"{folder}: no metadata.jsonl (expected GenEval's output layout)")
        meta = json.loads(meta_path.read_text(encoding="utf-8").splitlines()[0])
        check_metadata(meta, str(meta_path))
        images = sorted((folder / "samples").glob("*.png"))
        entries.append((meta, images))
    if not entries:
        raise SystemExit(f"{root}: no prompt folders (expected {root}/00000/metadata.jsonl ...)")
    return entries


def evaluate_folder(root: Path, scorer: GenEval) -> tuple[dict[str, float], dict[str, int]]:
    """The task table and the image count per task."""
    tags: list[str] = []
    correct: list[float] = []
    for meta, paths in read_folder(root):
        for path in paths:
            pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0
            image = torch.from_numpy(pixels).permute(2, 0, 1)[None]
            result = scorer.judge(image, [meta])[0]
            tags.append(meta["tag"])
            correct.append(float(result.correct))
    counts = {t: tags.count(t) for t in TASKS}
    return task_table(tags, correct), counts


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--detector", choices=("mask2former", "blob"), default="mask2former")
    parser.add_argument("--detector-model", default="facebook/mask2former-swin-small-coco-instance")
    parser.add_argument("--clip-model", default="openai/clip-vit-large-patch14")
    parser.add_argument("--blob-label", default="blob", help="ColourBlobDetector.label")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.detector == "blob":
        scorer = GenEval(
            detector=ColourBlobDetector(label=args.blob_label), colours=MeanColourClassifier()
        )
    else:
        scorer = GenEval(
            detector=Mask2FormerDetector(model=args.detector_model, device=args.device),
            colours=CLIPColourClassifier(model=args.clip_model, device=args.device),
        )
    table, counts = evaluate_folder(args.images, scorer)
    text = format_table(table, counts)
    print(text)
    return text


if __name__ == "__main__":
    main()
