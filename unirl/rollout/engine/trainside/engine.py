"""The trainside engine: the training module itself samples (direct sampling, no weight sync)."""

from __future__ import annotations

import dataclasses
import inspect
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
    ``reward_overlap``: score a training rollout's rewards on this worker chunk by chunk, each
    ``forward_batch_size`` chunk as soon as it is decoded, on a background thread while the
    next chunk samples (``unirl.reward.overlap``); the track comes back scored, with the same
    rewards as scoring at the end, and the driver does not score it again. Off by default: it
    is exact only for rewards that score each sample alone (no batch-normalised total).
    ``reward``: the reward role on this worker, passed by the trainer when ``reward_overlap``
    is set (not a recipe key).
    """

    engine_kind = "trainside"

    def __init__(
        self,
        *,
        pipeline: Any,
        forward_batch_size: PositiveInt | None = None,
        resident: bool = True,
        reward_overlap: bool = False,
        reward: Any = None,
    ) -> None:
        require(
            forward_batch_size is None or forward_batch_size >= 1,
            "rollout.forward_batch_size must be >= 1",
        )
        self.pipeline = pipeline
        self.resident = bool(resident)
        if forward_batch_size is not None:
            self.pipeline.forward_batch_size = forward_batch_size
        self.overlap: Any = None
        if reward_overlap:
            require(
                "on_decoded" in inspect.signature(pipeline.generate).parameters,
                f"rollout.reward_overlap=true: {type(pipeline).__name__}.generate cannot hand "
                "over decoded chunks; set rollout.reward_overlap=false",
            )
            require(
                reward is not None,
                "rollout.reward_overlap=true needs the reward role as a sibling (the diffusion "
                "trainer passes it); set rollout.reward_overlap=false",
            )
            self.overlap = getattr(reward, "service", reward).overlapped()

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """Sample this rank's shard of ``req``; tensors come back on CPU (the driver never
        touches a device), without the resident training inputs when ``resident``."""
        if self.overlap is not None and req.mode == "train" and "image" not in req.primitives:
            resp = self._generate_scored(req)
        else:
            resp = self.pipeline.generate(req)
        if self.resident and req.mode == "train":
            resp = park(resp, f"rollout_{req.rollout_index}")
        return resp.to("cpu")

    def _generate_scored(self, req: RolloutReq) -> RolloutResp:
        """Sample with each decoded chunk's reward queued at once; the track comes back with
        ``rewards``, ``component_rewards``, ``status`` and (as ``RewardWorker.score`` leaves
        them) the reward metrics in ``metadata[0]['_reward_metrics']``."""
        from unirl.models.common.pipeline import as_media

        fps = float(getattr(req.sampling_params, "fps", 16.0) or 16.0)

        def on_decoded(rows: slice, pixels: Any) -> None:
            chunk = RolloutTrack(
                sample_ids=req.sample_ids[rows],
                group_ids=req.group_ids[rows],
                prompts=list(req.prompts[rows]),
                metadata=list(req.metadata[rows]),
                decoded=as_media(pixels, fps=fps),
            )
            self.overlap.submit(chunk)

        resp = self.pipeline.generate(req, on_decoded=on_decoded)
        name, track = next(iter(resp.tracks.items()))
        scored, metrics = self.overlap.finish(track)
        meta = [dict(m) for m in scored.metadata]
        meta[0]["_reward_metrics"] = metrics
        tracks = dict(resp.tracks)
        tracks[name] = dataclasses.replace(scored, metadata=meta)
        return dataclasses.replace(resp, tracks=tracks)

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
