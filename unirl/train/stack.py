"""``TrainStack``: sequences one track through the algorithm and the backend.

Per rollout, on each train rank (its data-parallel shard of the track):

1. order the samples (seeded shuffle) and cut them into ``num_updates_per_batch``
   mini-batches, each into micro-batches of ``micro_batch_size`` samples or, for packed text
   segments, packed by a token budget (``max_tokens_per_micro_batch``);
2. freeze π_old once, before any update, micro-batch by micro-batch — at exactly the
   geometry the loss will use, so the first ratio is exactly 1;
3. per mini-batch: loss + backward per micro-batch, grad clip, non-finite check, optimizer step.

A non-finite loss or gradient norm is never skipped silently: the step is not applied, it is
counted and logged, and after ``max_nonfinite_in_row`` in a row the run stops with the step,
role and rank in the message.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NotRequired, Protocol, TypedDict

import torch
from torch.profiler import record_function

from unirl.algorithms.base import StageAlgorithm
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.train.compile_watch import RecompileWatch
from unirl.types import Batch, Conditions, RolloutTrack
from unirl.types.resident import RESIDENT, TRAIN_FIELDS, unpark

if TYPE_CHECKING:
    from unirl.train.backend import FSDPBackend

# one micro-batch as the stack trains it: (conditions, anchored segment, advantages[B])
MicroBatch = tuple[Conditions, Batch, torch.Tensor]


class TrackTrainResult(TypedDict):
    """What a train call returns: the metrics of each optimizer step, the checksum of the
    trainable parameters after them (compared across data-parallel ranks by the driver) and
    the algorithm's end-of-rollout metrics (its ``after_train``: KL control, NFT's old-adapter
    decay, …), run here so the driver needs no second call: ``after_train`` for one track,
    ``after_train_by_track`` for a joint step of several."""

    steps: list[dict[str, float]]
    param_checksum: float
    after_train: NotRequired[dict[str, float]]
    after_train_by_track: NotRequired[dict[str, dict[str, float]]]


class NonfiniteLimit(Protocol):
    """The knob :class:`OptimizerSteps` reads from its stack's config."""

    @property
    def max_nonfinite_in_row(self) -> int: ...


def _logp_gap(rollout: object, anchored: object) -> float:
    """max |rollout sde_logp − re-anchored sde_logp| (0 when nothing was recomputed)."""
    a, b = getattr(rollout, "sde_logp", None), getattr(anchored, "sde_logp", None)
    if a is None or b is None or a is b or a.numel() == 0:
        return 0.0
    return float((a.float() - b.float().to(a.device)).abs().max())


def pack_by_tokens(
    lengths: torch.Tensor, budget: int, count: int | None = None
) -> list[torch.Tensor]:
    """Cut rows with token counts ``lengths[B]`` into micro-batches of at most ``budget``
    tokens: first-fit decreasing (a row longer than the budget gets a micro-batch of its own).
    ``count`` (>= what the budget needs) asks for that many micro-batches: the fullest one with
    two rows or more is halved until there are ``count`` (data-parallel ranks must all run as
    many forwards as the rank that needs the most). Returns each micro-batch's row indices,
    ascending, the micro-batches ordered by their first row. Deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        size = int(lengths[i])
        for b, load in enumerate(loads):
            if load + size <= budget:
                bins[b].append(i)
                loads[b] += size
                break
        else:
            bins.append([i])
            loads.append(size)
    while count is not None and len(bins) < count:
        splittable = [b for b in range(len(bins)) if len(bins[b]) > 1]
        if not splittable:
            raise ValueError(
                f"cannot cut {len(lengths)} rows into {count} micro-batches (another rank "
                "needs that many); give every rank at least as many samples"
            )
        b = max(splittable, key=lambda k: (loads[k], -k))
        left: list[int] = []
        right: list[int] = []
        lload = rload = 0
        for i in sorted(bins[b], key=lambda i: (-int(lengths[i]), i)):  # greedy halves
            if lload <= rload:
                left.append(i)
                lload += int(lengths[i])
            else:
                right.append(i)
                rload += int(lengths[i])
        bins[b], loads[b] = left, lload
        bins.append(right)
        loads.append(rload)
    packed = sorted((sorted(b) for b in bins), key=lambda b: b[0])
    return [torch.tensor(b, dtype=torch.long) for b in packed]


CHECKSUM_CHUNK = 1 << 26  # elements flattened at once by TrainStack.param_checksum


def _sum_and_square_sum(flats: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """``[Σx, Σx²]`` (fp64, on ``device``) over the 1-D tensors ``flats``, concatenated in
    chunks of at most ``CHECKSUM_CHUNK`` elements (a larger tensor is a chunk of its own)."""
    out = torch.zeros(2, dtype=torch.float64, device=device)
    chunk: list[torch.Tensor] = []
    size = 0
    for t in [*flats, None]:
        if chunk and (t is None or size + t.numel() > CHECKSUM_CHUNK):
            flat = torch.cat(chunk).double()
            out += torch.stack([flat.sum(), flat.square().sum()])
            chunk, size = [], 0
        if t is not None:
            chunk.append(t)
            size += t.numel()
    return out


class NonFiniteError(RuntimeError):
    """Too many consecutive non-finite optimizer steps."""


@dataclass(kw_only=True)
class TrainStackConfig:
    """The knobs of a ``stack:`` block (``TrainStack`` takes them whole).

    ``micro_batch_size`` samples per forward + backward; ``num_updates_per_batch`` optimizer
    steps per rollout (each on an equal mini-batch of this rank's shard); ``max_grad_norm``
    clips the global gradient norm (``None``: no clipping, the norm is still logged);
    ``shuffle`` orders the samples by a permutation seeded by ``seed`` and the rollout index;
    ``max_nonfinite_in_row`` skipped non-finite steps in a row stop the run.
    ``max_tokens_per_micro_batch`` (text tracks): instead of a fixed sample count, pack each
    mini-batch into as few micro-batches as hold at most this many tokens each (the same
    number on every data-parallel rank; a longer sample gets one of its own); leave
    ``micro_batch_size`` at 1 then.
    """

    micro_batch_size: PositiveInt = 1
    num_updates_per_batch: PositiveInt = 1
    max_grad_norm: PositiveFloat | None = 1.0
    shuffle: bool = True
    max_nonfinite_in_row: PositiveInt = 3
    seed: int = 0
    max_tokens_per_micro_batch: PositiveInt | None = None

    def __post_init__(self) -> None:
        require(self.micro_batch_size >= 1, "stack.micro_batch_size must be >= 1")
        require(
            self.max_tokens_per_micro_batch is None or self.max_tokens_per_micro_batch >= 1,
            "stack.max_tokens_per_micro_batch must be >= 1 or null",
        )
        require(
            self.max_tokens_per_micro_batch is None or self.micro_batch_size == 1,
            "stack.micro_batch_size and stack.max_tokens_per_micro_batch are two ways to cut "
            "micro-batches; set one (max_tokens_per_micro_batch packs by tokens: leave "
            f"micro_batch_size at 1, got {self.micro_batch_size})",
        )
        require(self.num_updates_per_batch >= 1, "stack.num_updates_per_batch must be >= 1")
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "stack.max_grad_norm must be > 0 or null",
        )
        require(self.max_nonfinite_in_row >= 1, "stack.max_nonfinite_in_row must be >= 1")


class OptimizerSteps:
    """What every train stack keeps across optimizer steps, whatever it trains: the global step,
    the non-finite counters (skip a step whose loss or gradient norm is not finite on some
    rank; stop after ``max_nonfinite_in_row`` in a row), and their resume state. Subclasses
    set ``backend`` and ``config`` (with ``max_nonfinite_in_row``)."""

    backend: FSDPBackend
    config: NonfiniteLimit

    def __init__(self) -> None:
        self.nonfinite_in_row = 0
        self.nonfinite_total = 0
        self.global_step = 0
        self.compile_watch: RecompileWatch | None = None

    def watch_compiles(self) -> None:
        """Start counting compiled graphs when the backend compiles its blocks
        (``fsdp.compile``); subclasses call it once ``backend`` is set, before any rollout."""
        fsdp = getattr(self.backend, "fsdp_config", None)
        if fsdp is not None and getattr(fsdp, "compile", False):
            self.compile_watch = RecompileWatch()

    def compile_metrics(self, rollout_index: int) -> dict[str, float]:
        """``compile/new_graphs`` of the rollout that just trained (and the one warning when
        graphs keep being compiled after the first rollout); empty without ``fsdp.compile``."""
        if self.compile_watch is None:
            return {}
        # what the blocks compiled with: the backend's resolved value when it keeps one
        fsdp = getattr(self.backend, "fsdp_config", None)
        dynamic = getattr(self.backend, "compile_dynamic", getattr(fsdp, "compile_dynamic", False))
        hint = getattr(self.backend, "recompile_hint", None)  # the family's knob, if any
        return self.compile_watch.after_rollout(rollout_index, dynamic, hint)

    def _step_scalars(
        self, losses: list[float | torch.Tensor], grad_norm: torch.Tensor
    ) -> tuple[float, float, bool]:
        """``(loss, grad_norm, finite on every rank)`` with a single host read: all ranks must
        take (or skip) the optimizer step together."""
        device = self.backend.device
        parts = [torch.as_tensor(v, dtype=torch.float32).to(device).reshape(()) for v in losses]
        loss = torch.stack(parts).sum() if parts else torch.zeros((), device=device)
        norm = grad_norm.float().to(device).reshape(())
        bad = (~(torch.isfinite(loss) & torch.isfinite(norm))).float()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(bad)
        loss_v, norm_v, bad_v = torch.stack([loss, norm, bad]).tolist()
        return loss_v, norm_v, bad_v == 0.0

    def _take_step(
        self, finite: bool, metrics: dict[str, float], *, loss: float, grad_norm: float, at: str
    ) -> None:
        """The optimizer step when ``finite``; otherwise drop the gradient, count the skip
        (``metrics["nonfinite/skipped_step"]``; the caller reports ``nonfinite/count``) and
        raise :class:`NonFiniteError` after ``max_nonfinite_in_row`` in a row. ``at``: where,
        for the error (``rollout 3``)."""
        if finite:
            self.backend.optimizer_step()
            self.nonfinite_in_row = 0
            return
        self.backend.zero_grad()
        self.nonfinite_in_row += 1
        self.nonfinite_total += 1
        metrics["nonfinite/skipped_step"] = 1.0
        if self.nonfinite_in_row >= self.config.max_nonfinite_in_row:
            raise NonFiniteError(
                f"{self.nonfinite_in_row} non-finite optimizer steps in a row (loss={loss}, "
                f"grad_norm={grad_norm}) at global step {self.global_step}, {at}; lower the "
                "learning rate, check rewards and precision"
            )

    def memory_knobs(self) -> list[str]:
        """The recipe keys (with their values) that lower the training step's memory."""
        return []

    @contextlib.contextmanager
    def explain_out_of_memory(self, rollout_index: int) -> Iterator[None]:
        """Re-raise a device out-of-memory error of the training step with where it happened
        and what lowers the step's memory first (:meth:`memory_knobs`, and activation
        checkpointing when it is off); the allocator's text follows."""
        try:
            yield
        except torch.OutOfMemoryError as exc:
            knobs = self.memory_knobs()
            fix = "lower " + " or ".join(knobs) if knobs else "lower the micro-batch"
            fsdp = getattr(self.backend, "fsdp_config", None)
            if fsdp is not None and not getattr(fsdp, "activation_checkpointing", True):
                fix += ", or set backend.fsdp.activation_checkpointing=true"
            raise torch.OutOfMemoryError(
                f"out of memory in the training step of rollout {rollout_index}: {fix}; {exc}"
            ) from exc

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def state(self) -> dict[str, int]:
        return {"global_step": self.global_step, "nonfinite_total": self.nonfinite_total}

    @distributed(dispatch=Dispatch.BROADCAST)
    def load_state(self, state: dict[str, int]) -> None:
        self.global_step = int(state.get("global_step", 0))
        self.nonfinite_total = int(state.get("nonfinite_total", 0))


class TrainStack(OptimizerSteps):
    """Drives ``algorithm`` over a track with ``backend`` (an ``FSDPBackend``); its knobs are
    a :class:`TrainStackConfig` (the recipe's ``stack:`` keys, ``self.config``)."""

    config_class: ClassVar[type[TrainStackConfig]] = TrainStackConfig
    config: TrainStackConfig

    def __init__(self, *, backend: FSDPBackend, algorithm: StageAlgorithm, **knobs: Any) -> None:
        self.config = config = self.config_class(**knobs)
        require(
            config.num_updates_per_batch == 1 or algorithm.supports_multi_update,
            f"{type(algorithm).__name__} does not support several updates per rollout; "
            "set stack.num_updates_per_batch=1",
        )
        require(
            config.num_updates_per_batch == 1
            or getattr(algorithm, "old_logp_source", None) != "current",
            "algorithm.old_logp_source=current takes π_old from the loss forward, which is "
            "only the sampling policy's in the first optimizer step: set "
            "stack.num_updates_per_batch=1 or algorithm.old_logp_source=replay",
        )
        super().__init__()
        self.backend = backend
        self.algorithm = algorithm
        algorithm.bind_backend(backend)
        self.watch_compiles()

    def _order(self, n: int, rollout_index: int) -> torch.Tensor:
        if not self.config.shuffle:
            return torch.arange(n)
        gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + rollout_index)
        return torch.randperm(n, generator=gen)

    def plan_micro_batches(self, segment: Batch, n: int) -> list[list[torch.Tensor]]:
        """Row indices (into the ordered track) of every micro-batch, per mini-batch:
        ``num_updates_per_batch`` equal mini-batches of consecutive rows, each cut into
        ``micro_batch_size`` rows or, with ``max_tokens_per_micro_batch``, packed by tokens
        (:func:`pack_by_tokens`, the same count on every rank)."""
        cfg = self.config
        require(
            n % cfg.num_updates_per_batch == 0,
            f"{n} samples on this rank cannot be split into {cfg.num_updates_per_batch} mini-batches",
        )
        mini = n // cfg.num_updates_per_batch
        budget = cfg.max_tokens_per_micro_batch
        if budget is None:
            require(
                mini % cfg.micro_batch_size == 0,
                f"mini-batch {mini} not divisible by micro_batch_size {cfg.micro_batch_size}",
            )
            return [
                [
                    torch.arange(s, s + cfg.micro_batch_size)
                    for s in range(u * mini, (u + 1) * mini, cfg.micro_batch_size)
                ]
                for u in range(cfg.num_updates_per_batch)
            ]
        tokens = getattr(segment, "tokens", None)
        require(
            tokens is not None and hasattr(tokens, "lengths"),
            f"stack.max_tokens_per_micro_batch packs text segments by token count, but this "
            f"track's segment is a {type(segment).__name__}; use stack.micro_batch_size",
        )
        assert tokens is not None  # the require above refuses a segment without tokens
        lengths = tokens.lengths.cpu()
        over = int((lengths > budget).sum())
        if over and not getattr(self, "_warned_over_budget", False):
            self._warned_over_budget = True  # once per run: the first rollout that has one
            print(
                f"[unirl] warning: {over} of {len(lengths)} sequences on this rank are longer "
                f"than stack.max_tokens_per_micro_batch={budget} (longest "
                f"{int(lengths.max())} tokens); each trains in a micro-batch of its own, over "
                f"the budget; raise it to at least {int(lengths.max())}",
                flush=True,
            )
        parts = [lengths[u * mini : (u + 1) * mini] for u in range(cfg.num_updates_per_batch)]
        counts = torch.tensor([len(pack_by_tokens(p, budget)) for p in parts], dtype=torch.long)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            counts = counts.to(self.backend.device)  # every rank runs the most any rank needs
            torch.distributed.all_reduce(counts, op=torch.distributed.ReduceOp.MAX)
            counts = counts.cpu()
        return [
            [u * mini + rows for rows in pack_by_tokens(part, budget, int(counts[u]))]
            for u, part in enumerate(parts)
        ]

    def memory_knobs(self, stack_key: str = "stack", algorithm_key: str = "algorithm") -> list[str]:
        """The knobs that set this stack's activation memory, as recipe keys with their
        values: the micro-batch (or token budget), and the algorithm's slots per forward when
        above 1 (``stack_key`` / ``algorithm_key``: where the recipe puts them)."""
        cfg = self.config
        knobs = (
            [f"{stack_key}.max_tokens_per_micro_batch (now {cfg.max_tokens_per_micro_batch})"]
            if cfg.max_tokens_per_micro_batch is not None
            else [f"{stack_key}.micro_batch_size (now {cfg.micro_batch_size})"]
        )
        slots = getattr(self.algorithm, "slots_per_forward", 1)
        if slots > 1:
            knobs.append(f"{algorithm_key}.slots_per_forward (now {slots})")
        return knobs

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def train_track(self, track: RolloutTrack, rollout_index: int = 0) -> TrackTrainResult:
        """Train on this rank's shard of ``track`` (advantages attached); returns
        ``{"steps": [metrics of each optimizer step]}``. A device out-of-memory error names
        the knobs that lower the step's memory (:meth:`explain_out_of_memory`)."""
        with self.explain_out_of_memory(rollout_index):
            return self._train_track(track, rollout_index)

    def _train_track(self, track: RolloutTrack, rollout_index: int) -> TrackTrainResult:
        cfg = self.config
        resident_key = track.resident_key
        track = unpark(track, TRAIN_FIELDS)  # parked on this worker by the engine
        if track.advantages is None or track.segment is None or track.conditions is None:
            raise ValueError("train_track needs a track with conditions, segment and advantages")
        n = len(track)
        require(
            n % cfg.num_updates_per_batch == 0,
            f"{n} samples on this rank cannot be split into {cfg.num_updates_per_batch} mini-batches",
        )
        mini = n // cfg.num_updates_per_batch
        device = self.backend.device
        self.algorithm.start_rollout(rollout_index)
        track = track.select(self._order(n, rollout_index))
        # select keeps the fields checked above
        assert track.conditions is not None and track.segment is not None
        assert track.advantages is not None
        conditions = track.conditions.to(device)
        segment = track.segment.to(device)
        advantages = track.advantages.float().to(device)
        plan = self.plan_micro_batches(track.segment, n)

        t0 = time.perf_counter()
        micro = []
        anchor_gap = 0.0
        with record_function("unirl/train/prepare"):
            for idx in [i for update in plan for i in update]:
                # freeze π_old once, before any update, at training geometry
                cond_mb, seg_mb = conditions.select(idx), segment.select(idx)
                # a text algorithm narrows prepare_segment to a TextSegment (its override)
                prepared = self.algorithm.prepare_segment(cond_mb, seg_mb)  # type: ignore[arg-type]
                anchor_gap = max(anchor_gap, _logp_gap(seg_mb, prepared))
                micro.append((cond_mb, prepared, advantages[idx.to(advantages.device)]))
            micro = self.algorithm.prepare_batch(micro)  # batch-wide statistics, if any
        anchor_time = time.perf_counter() - t0

        all_metrics = []
        first = 0
        for update in range(cfg.num_updates_per_batch):
            t0 = time.perf_counter()
            self.backend.zero_grad()
            losses, terms = [], []
            batch = micro[first : first + len(plan[update])]
            first += len(plan[update])
            # each micro-batch's share of the mini-batch loss: its weight in the algorithm's
            # aggregation (samples by default; loss tokens for a token mean), so the gradient
            # does not depend on how the mini-batch was cut
            weights = [self.algorithm.micro_batch_weight(s, a) for _, s, a in batch]
            total = sum(weights)
            if total <= 0:  # nothing to weigh by (no loss token at all): by samples
                weights, total = [float(len(a)) for _, _, a in batch], float(mini)
            for (cond_mb, seg_mb, adv_mb), weight in zip(batch, weights, strict=True):
                result = self.algorithm.compute_loss_and_backward(
                    cond_mb, seg_mb, adv_mb, loss_scale=weight / total
                )
                losses.append(result.loss)
                terms.append(result.terms)
            # one host sync per optimizer step: loss, norm and the all-ranks finite flag together
            with record_function("unirl/train/grad_norm_and_sync"):
                loss, grad_norm, finite = self._step_scalars(
                    losses, self.backend.grad_norm_clipped(cfg.max_grad_norm)
                )
            metrics = {
                "loss": loss,
                "grad_norm": grad_norm,
                "lr": float(self.backend.lr),
                "nonfinite/count": float(self.nonfinite_total),
                "micro_batches": float(len(batch)),
            }
            with record_function("unirl/train/optimizer_step"):
                self._take_step(
                    finite,
                    metrics,
                    loss=loss,
                    grad_norm=grad_norm,
                    at=f"rollout {rollout_index}, update {update}",
                )
            metrics["nonfinite/count"] = float(self.nonfinite_total)
            self.global_step += 1
            merged = (
                {k: torch.cat([t[k] for t in terms]) for k in terms[0]}
                if terms and terms[0]
                else {}
            )
            with record_function("unirl/train/summarize"):
                metrics.update(self.algorithm.summarize(merged) if merged else {})
            metrics["time/train_step"] = time.perf_counter() - t0
            metrics["time/old_logp"] = anchor_time if update == 0 else 0.0
            # how far the sampler's log-probs are from the trainer's replay of the same steps
            # (0 with trainside fp32; the engine/precision gap for dedicated engines)
            metrics["old_logp/rollout_vs_replay_max"] = anchor_gap
            all_metrics.append(metrics)
        # graphs compiled this rollout (sampling and training): on the last step only, so the
        # driver's mean over steps is the rollout's count
        all_metrics[-1].update(self.compile_metrics(rollout_index))
        if resident_key is not None:
            RESIDENT.drop(resident_key)
        with record_function("unirl/train/param_checksum"):
            checksum = self.param_checksum()
        return {
            "steps": all_metrics,
            "param_checksum": checksum,
            "after_train": self.algorithm.after_train(rollout_index),
        }

    def param_checksum(self) -> float:
        """A checksum (Σx + Σx², fp64) of the full trainable parameters, so the driver can
        check that every data-parallel rank holds the same weights after a step. Sharded
        parameters add their local shards and one all-reduce completes the sums; one host
        read in all. The parameters are flattened into chunks of at most
        ``CHECKSUM_CHUNK`` elements, a handful of kernels per chunk: per-parameter reductions
        cost hundreds of launches for a LoRA's many small tensors (about 0.1 s of host time
        after every step, measured on an H100 host)."""
        device = self.backend.device
        parts: dict[bool, list[torch.Tensor]] = {False: [], True: []}
        for p in self.backend.trainable_parameters():
            is_shard = hasattr(p, "placements") and any(pl.is_shard() for pl in p.placements)
            t = (p.to_local() if hasattr(p, "to_local") else p).detach()
            parts[is_shard].append(t.reshape(-1).to(device))
        sums = {k: _sum_and_square_sum(v, device) for k, v in parts.items()}
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums[True])
        return float((sums[False] + sums[True]).sum())
