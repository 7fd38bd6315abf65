"""The trainside engine: the training module itself samples (direct sampling, no weight sync)."""

from __future__ import annotations

from typing import Any

from unirl.config.require import require
from unirl.config.typecheck import PositiveInt
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import RolloutReq, RolloutResp, RolloutTrack
from unirl.types.resident import park, unpark


class TrainsideEngine:
    """Samples with the pipeline that wraps the trained (LoRA / FSDP) module on this worker.

    There is no second copy of the weights, hence no ``sync`` block and no separate layout.
    Under FSDP every rank must run the same number of forwards: the driver splits the request
    into equal data-parallel shards (validated before the run starts).

    ``resident`` (default): a training rollout's conditions, trajectory segment and decoded
    media stay on this worker (``unirl.types.resident``) and the driver gets the track
    without them; the reward and train roles on the same rank pick them up by sample id, and
    the driver asks for the media only when it draws a gallery (:meth:`fetch_decoded`).
    ``False`` ships everything through the driver on CPU. ``forward_batch_size``: samples one
    denoise loop runs at once (sets the pipeline's; null keeps the pipeline's own).
    """

    engine_kind = "trainside"

    def __init__(
        self, *, pipeline: Any, forward_batch_size: PositiveInt | None = None, resident: bool = True
    ) -> None:
        require(
            forward_batch_size is None or forward_batch_size >= 1,
            "rollout.forward_batch_size must be >= 1",
        )
        self.pipeline = pipeline
        self.resident = bool(resident)
        if forward_batch_size is not None:
            self.pipeline.forward_batch_size = forward_batch_size

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """Sample this rank's shard of ``req``; tensors come back on CPU (the driver never
        touches a device), without the resident training inputs when ``resident``."""
        resp = self.pipeline.generate(req)
        if self.resident and req.mode == "train":
            resp = park(resp, f"rollout_{req.rollout_index}")
        return resp.to("cpu")

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def fetch_decoded(self, track: RolloutTrack) -> RolloutTrack:
        """This rank's shard of ``track`` with its parked media (on CPU); unchanged if none."""
        return unpark(track, ("decoded",)).to("cpu")

    @distributed(dispatch=Dispatch.BROADCAST)
    def sleep(self) -> None:
        """Nothing to free: the weights belong to the trainer."""

    @distributed(dispatch=Dispatch.BROADCAST)
    def wake_up(self) -> None:
        """Nothing to restore."""
