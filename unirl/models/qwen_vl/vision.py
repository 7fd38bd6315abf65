"""The image side of Qwen2-VL / Qwen2.5-VL, written from the published layout:

- ``patchify``: an image ``[3, H, W]`` in [0, 1] -> the vision tower's ``pixel_values``
  ``[(H/14)·(W/14), 3·2·14·14]`` (normalised with the CLIP mean / std, the frame repeated over
  the temporal patch of 2, patches ordered so that each 2x2 merge window is contiguous) and
  its grid ``(t, h, w) = (1, H/14, W/14)``; equal to transformers' ``Qwen2VLImageProcessor``
  output (tested);
- ``mrope_positions``: the three-axis (temporal, height, width) rotary positions of one
  sequence: a text token advances every axis by one; an image's ``h/2 x w/2`` tokens sit at
  ``(p, p + row, p + col)`` from the current position ``p``, after which ``p`` moves on by
  ``max(h, w) / 2``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PATCH = 14
MERGE = 2
TEMPORAL = 2
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


def image_tokens(height: int, width: int) -> int:
    """Tokens one ``height x width`` image takes in the text (after the 2x2 merge)."""
    return (height // PATCH) * (width // PATCH) // (MERGE * MERGE)


def patchify(image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pixel_values[n, 1176], grid_thw[3])`` of one ``image[3, H, W]`` in [0, 1]; H and W
    must be multiples of 28 (the bundle resizes to ``image_size``)."""
    channels, height, width = image.shape
    if height % (PATCH * MERGE) or width % (PATCH * MERGE):
        raise ValueError(
            f"image of {height}x{width}: both sides must be multiples of {PATCH * MERGE}"
        )
    mean = torch.tensor(IMAGE_MEAN, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(IMAGE_STD, dtype=torch.float32).view(3, 1, 1)
    x = (image.float() - mean) / std
    gh, gw = height // PATCH, width // PATCH
    frames = x.unsqueeze(0).expand(TEMPORAL, channels, height, width)
    blocks = frames.reshape(
        1, TEMPORAL, channels, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH
    )
    # (grid_t, block_h, block_w, merge_h, merge_w, channel, temporal, patch_h, patch_w)
    ordered = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    pixel_values = ordered.reshape(gh * gw, channels * TEMPORAL * PATCH * PATCH).contiguous()
    return pixel_values, torch.tensor([1, gh, gw], dtype=torch.long)


def mrope_positions(
    ids: Sequence[int], image_token_id: int, grids: Sequence[Sequence[int]]
) -> torch.Tensor:
    """``positions[3, L]`` of one sequence (no padding); ``grids``: ``(t, h, w)`` of each of
    its images in order (each image's ``t·h·w / 4`` tokens are contiguous runs of
    ``image_token_id``)."""
    out = torch.empty((3, len(ids)), dtype=torch.long)
    images = iter(grids)
    pos = 0
    i = 0
    while i < len(ids):
        if ids[i] != image_token_id:
            out[:, i] = pos
            pos += 1
            i += 1
            continue
        t, h, w = (int(v) for v in next(images))
        hh, ww = h // MERGE, w // MERGE
        count = t * hh * ww
        grid_t = torch.arange(t).repeat_interleave(hh * ww)
        grid_h = torch.arange(hh).repeat_interleave(ww).repeat(t)
        grid_w = torch.arange(ww).repeat(t * hh)
        out[:, i : i + count] = torch.stack([grid_t, grid_h, grid_w]) + pos
        pos += max(hh, ww)
        i += count
    return out


def padded_mrope_positions(
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    image_token_id: int,
    grids: torch.Tensor,
) -> torch.Tensor:
    """``positions[3, B, L]`` of a padded batch (left or right): each row's real tokens get
    :func:`mrope_positions` with its own image grid (``grids[B, 3]``, one image per row),
    padding gets 0."""
    b, length = input_ids.shape
    out = torch.zeros((3, b, length), dtype=torch.long)
    ids_host, mask_host = input_ids.cpu(), attention.cpu().bool()
    for row in range(b):
        real = ids_host[row][mask_host[row]].tolist()
        out[:, row, mask_host[row]] = mrope_positions(real, image_token_id, [grids[row].tolist()])
    return out.to(input_ids.device)
