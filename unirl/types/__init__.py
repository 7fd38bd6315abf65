"""Typed contracts that cross the rollout / train boundary (see README.md)."""

from __future__ import annotations

from unirl.types.batch import Batch, FieldKind, Packed, batch_field, host_to_device
from unirl.types.conditions import Conditions, TextEmbedConditions
from unirl.types.primitives import Images, Texts, Videos
from unirl.types.rollout import (
    STATUS_DROPPED,
    STATUS_OK,
    RolloutReq,
    RolloutResp,
    RolloutTrack,
    init_noise,
    noise_seed,
)
from unirl.types.sampling import ARSamplingParams, DiffusionSamplingParams
from unirl.types.segments import LatentSegment, TextSegment
from unirl.types.stage_request import DiffusionRequest, TextRequest

__all__ = [
    "STATUS_DROPPED",
    "STATUS_OK",
    "ARSamplingParams",
    "Batch",
    "Conditions",
    "DiffusionRequest",
    "DiffusionSamplingParams",
    "FieldKind",
    "Images",
    "LatentSegment",
    "Packed",
    "RolloutReq",
    "RolloutResp",
    "RolloutTrack",
    "TextEmbedConditions",
    "TextRequest",
    "TextSegment",
    "Texts",
    "Videos",
    "batch_field",
    "host_to_device",
    "init_noise",
    "noise_seed",
]
