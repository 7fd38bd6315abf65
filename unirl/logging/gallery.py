"""Galleries: one tile per sample with its prompt and reward underneath.

Images are PNG contact sheets; edits put the source left of the result in each tile;
videos are animated GIF contact sheets (one sheet per frame, every tile playing its video),
which browsers, W&B and image viewers all play without a codec.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

LINE_H = 12


def _uint8(pixels: torch.Tensor) -> np.ndarray:
    """``[..., 3, H, W]`` float in [0, 1] -> ``[..., H, W, 3]`` uint8."""
    array = (pixels.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    return array.movedim(-3, -1).numpy()


def _sheet(
    tiles: np.ndarray, captions: list[str], columns: int, size: tuple[int, int], lines: int
) -> Image.Image:
    """``tiles[N, H, W, 3]`` uint8 resized to ``size`` (w, h) on a white grid with captions."""
    tile_w, tile_h = size
    rows = math.ceil(len(tiles) / columns)
    cell_h = tile_h + lines * LINE_H + 6
    sheet = Image.new("RGB", (columns * tile_w, rows * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for i, tile in enumerate(tiles):
        x, y = (i % columns) * tile_w, (i // columns) * cell_h
        sheet.paste(
            Image.fromarray(tile).resize((tile_w, tile_h), Image.Resampling.NEAREST), (x, y)
        )
        for j, line in enumerate(textwrap.wrap(captions[i], max(tile_w // 6, 8))[:lines]):
            draw.text((x + 3, y + tile_h + 2 + j * LINE_H), line, fill="black", font=font)
    return sheet


def _check(n: int, captions: list[str], what: str) -> None:
    if n != len(captions):
        raise ValueError(f"{what}: {n} samples but {len(captions)} captions")


def _target(path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


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
    _check(pixels.shape[0], captions, "contact_sheet")
    columns = columns or min(pixels.shape[0], 8)
    sheet = _sheet(_uint8(pixels), captions, columns, (tile, tile), caption_lines)
    path = _target(path)
    sheet.save(path)
    return path


def edit_sheet(
    sources: torch.Tensor,
    results: torch.Tensor,
    captions: list[str],
    path: str | Path,
    *,
    columns: int | None = None,
    tile: int = 160,
    caption_lines: int = 3,
) -> Path:
    """Each tile is ``source | result`` (a 2-pixel white gap between them), then the caption
    (reward and instruction); ``sources`` and ``results`` are ``[N, 3, H, W]`` in [0, 1]."""
    _check(results.shape[0], captions, "edit_sheet")
    if sources.shape != results.shape:
        raise ValueError(
            f"edit_sheet: sources {tuple(sources.shape)} and results {tuple(results.shape)} differ"
        )
    gap = torch.ones((*results.shape[:-1], 2), dtype=results.dtype, device=results.device)
    pairs = torch.cat([sources.to(results), gap, results], dim=-1)
    columns = columns or min(results.shape[0], 4)
    sheet = _sheet(_uint8(pairs), captions, columns, (2 * tile + 2, tile), caption_lines)
    path = _target(path)
    sheet.save(path)
    return path


def video_sheet(
    frames: torch.Tensor,
    captions: list[str],
    path: str | Path,
    *,
    fps: float = 16.0,
    columns: int | None = None,
    tile: int = 160,
    caption_lines: int = 3,
) -> Path:
    """Write ``frames[N, T, 3, H, W]`` as an animated GIF grid (loops forever at ``fps``,
    GIF's 10 ms resolution); ``path`` should end in ``.gif``."""
    if frames.ndim != 5:
        raise ValueError(f"video_sheet: frames must be [N, T, 3, H, W], got {tuple(frames.shape)}")
    _check(frames.shape[0], captions, "video_sheet")
    columns = columns or min(frames.shape[0], 4)
    array = _uint8(frames)  # [N, T, H, W, 3]
    sheets = [
        _sheet(array[:, t], captions, columns, (tile, tile), caption_lines)
        for t in range(array.shape[1])
    ]
    path = _target(path)
    duration = max(20, int(100 / fps + 0.5) * 10)  # ms, rounded half up to GIF's 10 ms
    sheets[0].save(path, save_all=True, append_images=sheets[1:], duration=duration, loop=0)
    return path
