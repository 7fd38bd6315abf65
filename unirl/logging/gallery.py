"""PNG contact sheets: one tile per sample with its prompt and reward underneath."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont


def contact_sheet(
    pixels: torch.Tensor,
    captions: list[str],
    path: str | Path,
    *,
    columns: int | None = None,
    tile: int = 192,
    caption_lines: int = 3,
) -> Path:
    """Write ``pixels[N, 3, H, W]`` (float in [0, 1]) as a grid with ``captions``; returns the path."""
    n = pixels.shape[0]
    if n != len(captions):
        raise ValueError(f"contact_sheet: {n} images but {len(captions)} captions")
    columns = columns or min(n, 8)
    rows = math.ceil(n / columns)
    font = ImageFont.load_default()
    line_h = 12
    cell_h = tile + caption_lines * line_h + 6
    sheet = Image.new("RGB", (columns * tile, rows * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    array = (
        (pixels.detach().float().clamp(0, 1) * 255)
        .round()
        .to(torch.uint8)
        .permute(0, 2, 3, 1)
        .cpu()
        .numpy()
    )
    for i in range(n):
        x, y = (i % columns) * tile, (i // columns) * cell_h
        img = Image.fromarray(array[i]).resize((tile, tile), Image.NEAREST)
        sheet.paste(img, (x, y))
        chars = max(tile // 6, 8)
        lines = textwrap.wrap(captions[i], chars)[:caption_lines]
        for j, line in enumerate(lines):
            draw.text((x + 3, y + tile + 2 + j * line_h), line, fill="black", font=font)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)
    return path
