"""Small driver-callable roles that adapt plain components (reward service, backend) to the
single-controller layer. They live on the same workers as their siblings."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.types import Images, RolloutTrack


class RewardWorker:
    """Scores this rank's shard of a track with a ``RewardService`` built from ``service``."""

    def __init__(self, *, service: Any) -> None:
        if isinstance(service, dict):
            from hydra.utils import instantiate

            service = instantiate(service, _convert_="object")
        self.service = service

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def score(self, track: RolloutTrack) -> RolloutTrack:
        """The shard with ``rewards``, ``component_rewards`` and ``status`` attached; guard and
        failure metrics ride along in ``metadata[0]['_reward_metrics']`` of the first sample."""
        scored, metrics = self.service.score_track(track)
        meta = [dict(m) for m in scored.metadata]
        meta[0]["_reward_metrics"] = metrics
        return dataclasses.replace(scored, metadata=meta)


def light_track(track: RolloutTrack) -> RolloutTrack:
    """The fields a reward needs (media, prompts, ids): no latents or embeddings on the wire."""
    return RolloutTrack(
        sample_ids=track.sample_ids,
        group_ids=track.group_ids,
        prompts=track.prompts,
        metadata=track.metadata,
        decoded=track.decoded,
        status=track.status,
    )


class TrainOps:
    """Checkpoint, export and eval-weight switches of the backend, callable from the driver."""

    def __init__(self, *, backend: Any, pipeline: Any) -> None:
        self.backend = backend
        self.pipeline = pipeline
        self._eval_ctx: contextlib.ExitStack | None = None

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def describe(self, height: int, width: int) -> dict[str, Any]:
        bundle = self.pipeline.bundle
        return {
            "scheduler_config": dict(bundle.scheduler_config),
            "latent_shape": tuple(bundle.latent_shape(height, width)),
            "image_seq_len": int(bundle.image_seq_len(height, width)),
            "trainable_params": int(self.backend.num_trainable_params()),
            "device": str(self.backend.device),
        }

    @distributed(dispatch=Dispatch.BROADCAST)
    def save_checkpoint(self, path: str, extra: dict[str, Any]) -> None:
        self.backend.save_checkpoint(path, extra=extra)

    @distributed(dispatch=Dispatch.BROADCAST)
    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.backend.load_checkpoint(path)

    @distributed(dispatch=Dispatch.BROADCAST)
    def export_lora(self, path: str) -> None:
        self.backend.export_lora(path)

    @distributed(dispatch=Dispatch.BROADCAST)
    def use_eval_weights(self, enabled: bool) -> bool:
        """Swap EMA weights in (``True``) or back out (``False``); returns whether EMA exists."""
        has_ema = getattr(self.backend, "has_ema", False)
        if enabled and has_ema and self._eval_ctx is None:
            self._eval_ctx = contextlib.ExitStack()
            self._eval_ctx.enter_context(self.backend.ema_weights())
        elif not enabled and self._eval_ctx is not None:
            self._eval_ctx.close()
            self._eval_ctx = None
        return bool(has_ema)


def pixels_of(track: RolloutTrack) -> torch.Tensor:
    decoded = track.decoded
    if not isinstance(decoded, Images):
        raise TypeError(f"expected decoded Images on the track, got {type(decoded).__name__}")
    return decoded.pixels
