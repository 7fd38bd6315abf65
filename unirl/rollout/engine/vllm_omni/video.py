"""Decoded videos from vLLM-Omni outputs, as ``Videos.frames`` wants them."""

from __future__ import annotations

from typing import Any

import torch

from unirl.rollout.engine.dedicated.trajectory import EngineContractError


def frames_from_output(videos: Any) -> torch.Tensor:
    """``frames[N, T, 3, H, W]`` float32 in [0, 1] from a list / tensor of per-sample videos
    given frame-first as ``[T, 3, H, W]`` or ``[T, H, W, 3]``, uint8 (0..255) or float (0..1).
    Any other layout (e.g. channel-first ``[3, T, H, W]``) is refused rather than guessed."""
    if isinstance(videos, torch.Tensor):
        batch = videos
    else:
        import numpy as np

        batch = torch.stack(
            [
                v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v).copy())
                for v in videos
            ]
        )
    if batch.ndim != 5 or 3 not in (batch.shape[2], batch.shape[-1]):
        raise EngineContractError(
            "vllm_omni: videos must be a batch of frame-first [T, 3, H, W] or [T, H, W, 3], got "
            f"{list(batch.shape)}"
        )
    if batch.shape[2] != 3:
        batch = batch.permute(0, 1, 4, 2, 3)
    if batch.dtype == torch.uint8:
        return batch.float() / 255.0
    return batch.float().clamp(0.0, 1.0)
