"""``UnifiedTrainStack``: two tracks, two losses, one backend, one optimizer step.

A unified model (one transformer that writes text and draws images) trains both of its
tracks on the same weights. Per rollout, on each train rank (its data-parallel shard of both
tracks; the shards are aligned, sample ``i`` of the image track is the image of text sample
``i``):

1. each track is ordered (seeded shuffle, one permutation for both) and cut into micro-batches
   as :class:`~unirl.train.stack.TrainStack` cuts one track (``micro_batch_size`` samples, or
   packed by ``max_tokens_per_micro_batch`` for text);
2. π_old is frozen once per track (``prepare_segment``) at the training geometry, before any
   gradient, so both first ratios are exactly 1;
3. one ``zero_grad``; the text loss's micro-batches backward with ``loss_scale =
   text.weight · share``, then the image loss's with ``image.weight · share`` (``share``: the
   micro-batch's weight in its own track's aggregation, as in ``TrainStack``); the gradient is
   that of ``text.weight · L_text + image.weight · L_image``;
4. one clip of the global norm, one non-finite check, one optimizer step.

A track whose ``weight`` is 0 is sampled (the image still reads the text) but not trained: no
anchor, no loss, no backward (``stack.text.weight: 0`` trains a think-then-draw model's image
tokens alone).

The micro-batch planning, shuffle, step scalars and parameter checksum are ``TrainStack``'s
own (one inner stack per track, sharing the backend; their optimizer loop is not used).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from unirl.algorithms.base import StageAlgorithm
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.train.stack import (
    MicroBatch,
    OptimizerSteps,
    TrackTrainResult,
    TrainStack,
    _logp_gap,
)
from unirl.types import RolloutTrack
from unirl.types.resident import RESIDENT, TRAIN_FIELDS, unpark

if TYPE_CHECKING:
    from unirl.train.backend import FSDPBackend

TRACKS = ("text", "image")


@dataclass(kw_only=True)
class TrackLossConfig:
    """One track's part of the joint loss: its ``weight`` and how its micro-batches are cut
    (``micro_batch_size`` samples, or ``max_tokens_per_micro_batch`` for a text track)."""

    weight: float = 1.0
    micro_batch_size: PositiveInt = 1
    max_tokens_per_micro_batch: PositiveInt | None = None

    def __post_init__(self) -> None:
        require(self.weight >= 0.0, f"stack.<track>.weight must be >= 0, got {self.weight}")


@dataclass(kw_only=True)
class UnifiedTrainStackConfig:
    """The ``stack:`` block of a unified recipe: ``text`` / ``image`` (:class:`TrackLossConfig`:
    loss weight and micro-batching), and the step knobs of ``TrainStackConfig``
    (``max_grad_norm``, ``shuffle``, ``seed``, ``max_nonfinite_in_row``). One optimizer step
    per rollout (``num_updates_per_batch`` is 1 by construction)."""

    text: TrackLossConfig = field(default_factory=TrackLossConfig)
    image: TrackLossConfig = field(default_factory=TrackLossConfig)
    max_grad_norm: PositiveFloat | None = 1.0
    shuffle: bool = True
    max_nonfinite_in_row: PositiveInt = 3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in TRACKS:
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, TrackLossConfig(**value))
        require(
            self.text.weight > 0 or self.image.weight > 0,
            "stack.text.weight and stack.image.weight are both 0: nothing would train",
        )
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "stack.max_grad_norm must be > 0 or null",
        )

    # what the batch-geometry validators read of any stack's typed config
    @property
    def num_updates_per_batch(self) -> int:
        """One optimizer step per rollout, always."""
        return 1

    @property
    def micro_batch_size(self) -> int:
        """The image track's (the text track may pack by tokens instead)."""
        return int(self.image.micro_batch_size)


class UnifiedTrainStack(OptimizerSteps):
    """Drives ``text_algorithm`` (a token loss, e.g. GRPO) and ``image_algorithm`` (a
    flow-matching loss, e.g. Flow-GRPO) over the two tracks of one rollout with one
    ``backend`` (see the module docstring)."""

    config_class: ClassVar[type[UnifiedTrainStackConfig]] = UnifiedTrainStackConfig
    config: UnifiedTrainStackConfig

    def __init__(
        self,
        *,
        backend: FSDPBackend,
        text_algorithm: StageAlgorithm,
        image_algorithm: StageAlgorithm,
        **knobs: Any,
    ) -> None:
        super().__init__()
        self.config = config = self.config_class(**knobs)
        self.backend = backend
        self.algorithms = {"text": text_algorithm, "image": image_algorithm}
        self.stacks = {
            name: TrainStack(
                backend=backend,
                algorithm=self.algorithms[name],
                micro_batch_size=getattr(config, name).micro_batch_size,
                max_tokens_per_micro_batch=getattr(config, name).max_tokens_per_micro_batch,
                num_updates_per_batch=1,
                max_grad_norm=config.max_grad_norm,
                shuffle=config.shuffle,
                seed=config.seed,
                max_nonfinite_in_row=config.max_nonfinite_in_row,
            )
            for name in TRACKS
        }
        self.watch_compiles()

    def memory_knobs(self) -> list[str]:
        return [
            *self.stacks["text"].memory_knobs("stack.text", "algorithm"),
            *self.stacks["image"].memory_knobs("stack.image", "unified.image.algorithm"),
        ]

    def weight(self, name: str) -> float:
        return float(getattr(self.config, name).weight)

    # -- the phases (public so tests can check the joint gradient) -------------------------------

    def prepare(
        self, tracks: dict[str, RolloutTrack], rollout_index: int
    ) -> dict[str, list[MicroBatch]]:
        """Per track, its micro-batches ``(conditions, anchored segment, advantages)`` in
        training order, π_old frozen at that geometry. Both tracks use one permutation."""
        lengths = {len(t) for t in tracks.values()}
        require(len(lengths) == 1, f"the tracks' shards differ in length: {lengths}")
        n = lengths.pop()
        order = self.stacks["text"]._order(n, rollout_index)
        device = self.backend.device
        self._anchor_gap = 0.0
        out: dict[str, list[MicroBatch]] = {}
        for name in TRACKS:
            if self.weight(name) == 0.0:  # a track that does not train: no replay, no loss
                out[name] = []
                continue
            track = tracks[name]
            if track.advantages is None or track.segment is None or track.conditions is None:
                raise ValueError(
                    f"the {name} track needs conditions, segment and advantages to train"
                )
            algorithm, stack = self.algorithms[name], self.stacks[name]
            algorithm.start_rollout(rollout_index)
            track = track.select(order)
            assert track.conditions is not None and track.segment is not None
            assert track.advantages is not None
            conditions = track.conditions.to(device)
            segment = track.segment.to(device)
            advantages = track.advantages.float().to(device)
            micro = []
            for idx in stack.plan_micro_batches(track.segment, n)[0]:
                cond_mb, seg_mb = conditions.select(idx), segment.select(idx)
                prepared = algorithm.prepare_segment(cond_mb, seg_mb)
                self._anchor_gap = max(self._anchor_gap, _logp_gap(seg_mb, prepared))
                micro.append((cond_mb, prepared, advantages[idx.to(advantages.device)]))
            out[name] = algorithm.prepare_batch(micro)
        return out

    def backward(
        self, micro: dict[str, list[MicroBatch]]
    ) -> tuple[dict[str, list[float | torch.Tensor]], dict[str, list[dict[str, torch.Tensor]]]]:
        """``zero_grad``, then every micro-batch's loss and backward, each scaled by its track's
        weight times its share of the track; returns the per-track losses and terms. The
        gradient left on the parameters is that of ``Σ_track weight · L_track``."""
        self.backend.zero_grad()
        losses: dict[str, list[float | torch.Tensor]] = {}
        terms: dict[str, list[dict[str, torch.Tensor]]] = {}
        for name in TRACKS:
            algorithm, batch = self.algorithms[name], micro[name]
            weights = [algorithm.micro_batch_weight(s, a) for _, s, a in batch]
            total = sum(weights)
            if total <= 0:  # nothing to weigh by (no loss token at all): by samples
                weights = [float(len(a)) for _, _, a in batch]
                total = sum(weights)
            losses[name], terms[name] = [], []
            for (cond_mb, seg_mb, adv_mb), w in zip(batch, weights, strict=True):
                result = algorithm.compute_loss_and_backward(
                    cond_mb, seg_mb, adv_mb, loss_scale=self.weight(name) * w / total
                )
                losses[name].append(result.loss)
                terms[name].append(result.terms)
        return losses, terms

    # -- the step ----------------------------------------------------------------------------------

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def train_tracks(
        self, text: RolloutTrack, image: RolloutTrack, rollout_index: int = 0
    ) -> TrackTrainResult:
        """One optimizer step on this rank's shards of both tracks (advantages attached);
        returns ``{"steps": [metrics], "param_checksum": float}`` like ``TrainStack``; a
        device out-of-memory error names both tracks' memory knobs."""
        with self.explain_out_of_memory(rollout_index):
            return self._train_tracks(text, image, rollout_index)

    def _train_tracks(
        self, text: RolloutTrack, image: RolloutTrack, rollout_index: int
    ) -> TrackTrainResult:
        keys = {"text": text.resident_key, "image": image.resident_key}
        tracks = {"text": unpark(text, TRAIN_FIELDS), "image": unpark(image, TRAIN_FIELDS)}
        t0 = time.perf_counter()
        micro = self.prepare(tracks, rollout_index)
        anchor_time = time.perf_counter() - t0
        t0 = time.perf_counter()
        losses, terms = self.backward(micro)
        all_losses = losses["text"] + losses["image"]
        loss, grad_norm, finite = self._step_scalars(
            all_losses, self.backend.grad_norm_clipped(self.config.max_grad_norm)
        )
        metrics: dict[str, float] = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": float(self.backend.lr),
            "micro_batches": float(len(all_losses)),
        }
        for name in TRACKS:  # each track's weighted share of the joint loss
            parts = [torch.as_tensor(v, dtype=torch.float32).reshape(()) for v in losses[name]]
            metrics[f"{name}/loss"] = float(torch.stack(parts).sum()) if parts else 0.0
            metrics[f"{name}/weight"] = self.weight(name)
        self._take_step(
            finite, metrics, loss=loss, grad_norm=grad_norm, at=f"rollout {rollout_index}"
        )
        metrics["nonfinite/count"] = float(self.nonfinite_total)
        self.global_step += 1
        for name in TRACKS:
            merged = terms[name]
            if merged and merged[0]:
                joined = {k: torch.cat([t[k] for t in merged]) for k in merged[0]}
                summary = self.algorithms[name].summarize(joined)
                metrics.update({f"{name}/{k}": v for k, v in summary.items()})
        metrics["time/train_step"] = time.perf_counter() - t0
        metrics["time/old_logp"] = anchor_time
        metrics["old_logp/rollout_vs_replay_max"] = self._anchor_gap
        metrics.update(self.compile_metrics(rollout_index))
        for key in keys.values():
            if key is not None:
                RESIDENT.drop(key)
        return {
            "steps": [metrics],
            "param_checksum": self.stacks["text"].param_checksum(),
            # each loss node's end-of-rollout metrics, a weight-0 track's too (as before)
            "after_train_by_track": {
                name: self.algorithms[name].after_train(rollout_index) for name in TRACKS
            },
        }
