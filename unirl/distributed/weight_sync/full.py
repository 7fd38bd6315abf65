"""``FullSync``: every trainable parameter of a full fine-tune -> the engine's copy."""

from __future__ import annotations

from typing import ClassVar

from unirl.distributed.weight_sync.base import WeightSync


class FullSync(WeightSync):
    """Moves all trainable parameters (GBs for SD3.5-M).

    Separate layout: a bucketed broadcast over a dedicated ``torch.distributed`` group of
    trainer rank 0 + every rollout rank (gloo on CPU, NCCL on GPU; crosses slabs and nodes).
    Colocate: the gathered tensors are handed to the sibling engine in-process.
    """

    kind: ClassVar[str] = "full"
    default_transport: ClassVar[dict[str, str]] = {"colocate": "local", "separate": "collective"}
