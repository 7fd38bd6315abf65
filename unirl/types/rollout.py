"""The rollout boundary: ``RolloutReq`` in, ``RolloutResp`` (named ``RolloutTrack``s) out."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from unirl.types.batch import Batch, batch_field
from unirl.types.conditions import Conditions
from unirl.types.segments import LatentSegment, TextSegment

B = TypeVar("B", bound=Batch)

STATUS_OK = 0
STATUS_DROPPED = 1


def noise_seed(seed: int, sample_id: int, stream: str = "x_T") -> int:
    """A 63-bit generator seed for ``(run seed, sample id, stream)``, stable across processes."""
    digest = hashlib.blake2b(f"{seed}:{sample_id}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def init_noise(
    ids: torch.Tensor, shape: tuple[int, ...], seed: int, stream: str = "x_T"
) -> torch.Tensor:
    """x_T for each id, regenerated deterministically on CPU in fp32: ``[len(ids), *shape]``.

    Every engine calls this with the diffusion request's ``init_noise_ids`` and
    ``init_noise_shape`` (``DiffusionRequest.initial_noise``) so all engines start from
    identical noise whatever the data-parallel split.
    """
    out = torch.empty((len(ids), *shape), dtype=torch.float32)
    gen = torch.Generator(device="cpu")
    for row, sample_id in enumerate(ids.tolist()):
        gen.manual_seed(noise_seed(seed, int(sample_id), stream))
        out[row] = torch.randn(shape, generator=gen, dtype=torch.float32)
    return out


@dataclass(kw_only=True)
class RolloutReq(Batch):
    """What the driver asks an engine to sample.

    ``primitives`` maps a modality to its per-sample inputs (``{"text": Texts}``);
    ``stage_params`` maps a stage (track) name to that stage's typed request block, e.g.
    ``{"diffusion": DiffusionRequest}`` (σ schedule, SDE steps, x_T recipe); read one with
    :meth:`params_for`. ``seed`` seeds every noise stream of the request.
    """

    sample_ids: torch.Tensor = batch_field("concat")
    group_ids: torch.Tensor = batch_field("concat")
    primitives: dict[str, Batch] = batch_field("concat", default_factory=dict)
    metadata: list[dict[str, Any]] = batch_field("concat", default_factory=list)
    stage_params: dict[str, Batch] = batch_field("concat", default_factory=dict)
    sampling_params: Any = batch_field("shared", default=None)
    seed: int = batch_field("shared", default=0)
    rollout_index: int = batch_field("shared", default=0)
    mode: Literal["train", "eval"] = batch_field("shared", default="train")

    def __post_init__(self) -> None:
        n = len(self.sample_ids)
        if len(self.group_ids) != n:
            raise ValueError(f"RolloutReq.group_ids has {len(self.group_ids)} rows, sample_ids {n}")
        if not self.metadata:
            self.metadata = [{} for _ in range(n)]
        for stage, block in self.stage_params.items():
            if not isinstance(block, Batch):
                raise TypeError(
                    f"RolloutReq.stage_params[{stage!r}] must be a Batch block, got "
                    f"{type(block).__name__}"
                )
            if len(block) != n:
                raise ValueError(
                    f"RolloutReq.stage_params[{stage!r}] has {len(block)} rows, sample_ids {n}"
                )
        self.validate_lengths()

    @property
    def prompts(self) -> list[str]:
        text = self.primitives.get("text")
        if text is None:
            raise KeyError("RolloutReq has no 'text' primitive")
        return list(text.texts)  # type: ignore[attr-defined]

    def params_for(self, stage: str, kind: type[B]) -> B:
        """The ``kind`` block of stage ``stage``; raises ``ValueError`` naming what is there."""
        block = self.stage_params.get(stage)
        if block is None:
            raise ValueError(
                f"RolloutReq carries no {kind.__name__} for stage {stage!r} (stage_params: "
                f"{sorted(self.stage_params)}); the driver authors it in build_request"
            )
        if not isinstance(block, kind):
            raise ValueError(
                f"RolloutReq.stage_params[{stage!r}] is a {type(block).__name__}, expected "
                f"{kind.__name__}"
            )
        return block


@dataclass(kw_only=True)
class RolloutTrack(Batch):
    """One stage's samples: lineage, conditions, trajectory segment, media (and the reference
    media of an editing request), rewards, advantages.

    ``status[N]``: 0 ok, 1 dropped (excluded from advantages and training).
    """

    sample_ids: torch.Tensor = batch_field("concat")
    group_ids: torch.Tensor = batch_field("concat")
    prompts: list[str] | None = batch_field("concat", default=None)
    metadata: list[dict[str, Any]] = batch_field("concat", default_factory=list)
    parent_ids: torch.Tensor | None = batch_field("concat", default=None)
    conditions: Conditions | None = batch_field("concat", default=None)
    segment: LatentSegment | TextSegment | None = batch_field("concat", default=None)
    decoded: Batch | None = batch_field("concat", default=None)
    # editing: the source media each sample was conditioned on (``Images``), for edit
    # rewards and source | edited galleries
    references: Batch | None = batch_field("concat", default=None)
    rewards: torch.Tensor | None = batch_field("concat", default=None)
    component_rewards: dict[str, torch.Tensor] | None = batch_field("concat", default=None)
    advantages: torch.Tensor | None = batch_field("concat", default=None)
    status: torch.Tensor | None = batch_field("concat", default=None)
    parent_track: str | None = batch_field("shared", default=None)
    # set while conditions / segment stay on the sampling worker (unirl/types/resident.py)
    resident_key: str | None = batch_field("shared", default=None)

    def __post_init__(self) -> None:
        if self.status is None:
            self.status = torch.zeros(len(self.sample_ids), dtype=torch.long)
        if not self.metadata:
            self.metadata = [{} for _ in range(len(self.sample_ids))]
        if (self.parent_ids is None) != (self.parent_track is None):
            raise ValueError("RolloutTrack.parent_ids and parent_track must be set together")
        self.validate_lengths()

    @property
    def kept(self) -> torch.Tensor:
        """``BoolTensor[N]``: samples that are not dropped."""
        assert self.status is not None
        return self.status == STATUS_OK

    def compute_advantages(
        self,
        *,
        scope: Literal["group", "global", "leave_one_out"] = "group",
        std: Literal["group", "batch", "none"] = "group",
        eps: float = 1e-4,
        clip: float | None = 5.0,
    ) -> tuple[RolloutTrack, dict[str, float]]:
        """GRPO advantages ``A = (R − mean) / (std + eps)``, clipped to ±clip.

        ``scope`` picks the baseline: the group's mean, the batch's, or ``leave_one_out``, the
        mean of the *other* samples of the group (RLOO, Ahmadian et al., 2024:
        ``R_i − (ΣR − R_i)/(n − 1)``; a group of one gets 0); ``std`` picks the divisor
        (per group, the whole batch — the SD3 recipes' ``global_std`` — or none). Dropped
        samples get 0 and are excluded from every statistic. Returns the new track and metrics
        (``zero_std_ratio``: fraction of groups whose rewards are all equal).
        """
        if self.rewards is None:
            raise ValueError("compute_advantages needs rewards; score the track first")
        rewards = self.rewards.detach().to(torch.float64).cpu()
        kept = self.kept.cpu()
        if not torch.isfinite(rewards[kept]).all():
            bad = [i for i in range(len(rewards)) if kept[i] and not torch.isfinite(rewards[i])]
            raise ValueError(
                f"non-finite rewards for samples {bad}; the reward service must not pass them"
            )
        groups = self.group_ids.cpu()
        adv = torch.zeros_like(rewards)
        batch_vals = rewards[kept]
        batch_mean = (
            batch_vals.mean() if batch_vals.numel() else torch.tensor(0.0, dtype=torch.float64)
        )
        batch_std = (
            batch_vals.std(unbiased=False)
            if batch_vals.numel() > 1
            else torch.tensor(0.0, dtype=torch.float64)
        )
        zero_std_groups, num_groups = 0, 0
        for gid in torch.unique(groups[kept]).tolist():
            members = (groups == gid) & kept
            vals = rewards[members]
            num_groups += 1
            group_std = (
                vals.std(unbiased=False)
                if vals.numel() > 1
                else torch.tensor(0.0, dtype=torch.float64)
            )
            if float(vals.max() - vals.min()) == 0.0:
                zero_std_groups += 1
            if scope == "leave_one_out":
                others = max(vals.numel() - 1, 1)
                mean = (vals.sum() - vals) / others if vals.numel() > 1 else vals
            else:
                mean = vals.mean() if scope == "group" else batch_mean
            divisor = {"group": group_std, "batch": batch_std, "none": torch.tensor(0.0)}[std]
            denom = float(divisor + eps) if std != "none" else 1.0
            # a constant group has a zero numerator: its advantage is 0 even with eps = 0
            adv[members] = (vals - mean) / denom if denom > 0 else torch.zeros_like(vals)
        if clip is not None:
            adv = adv.clamp(-clip, clip)
        advantages = adv.to(torch.float32).to(self.rewards.device)
        kept_adv = adv[kept]
        metrics = {
            "advantage/mean": float(kept_adv.mean()) if kept_adv.numel() else 0.0,
            "advantage/std": float(kept_adv.std(unbiased=False)) if kept_adv.numel() > 1 else 0.0,
            "advantage/abs_max": float(kept_adv.abs().max()) if kept_adv.numel() else 0.0,
            "advantage/zero_std_ratio": zero_std_groups / max(num_groups, 1),
        }
        return dataclasses.replace(self, advantages=advantages), metrics


@dataclass(kw_only=True)
class RolloutResp(Batch):
    """An engine's answer: ``tracks`` by stage name plus per-phase ``timings`` (seconds, max-reduced)."""

    tracks: dict[str, RolloutTrack] = batch_field("concat", default_factory=dict)
    timings: dict[str, float] = batch_field("max", default_factory=dict)

    def __post_init__(self) -> None:
        self.validate_lineage()

    def validate_lineage(self) -> None:
        """Every child track's ``parent_ids`` must name samples of its ``parent_track``."""
        for name, track in self.tracks.items():
            if track.parent_track is None:
                continue
            parent = self.tracks.get(track.parent_track)
            if parent is None:
                raise ValueError(
                    f"track {name!r} names parent track {track.parent_track!r}, which is absent"
                )
            known = set(parent.sample_ids.tolist())
            missing = [i for i in track.parent_ids.tolist() if i not in known]  # type: ignore[union-attr]
            if missing:
                raise ValueError(f"track {name!r} points at unknown parent samples {missing[:8]}")

    def __len__(self) -> int:
        return len(next(iter(self.tracks.values()))) if self.tracks else 0
