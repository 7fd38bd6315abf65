"""The stage: the unit of the loop.

A stage is one track of a ``RolloutResp`` (``diffusion``, ``text``, …) with what acts on it:
the roles that score it, train it and sync its weights. A diffusion recipe has one stage; a
prompt enhancer has two (the AR parent track and the diffusion child track it feeds); a
unified model has two that share a backend. The loop in :mod:`unirl.trainer.base` walks the
stages of every response in the same order for every domain:

    rollout -> reward on scored tracks -> propagate to parents -> advantages -> train -> sync

Only rewards cross stages, through lineage: a child track's samples name their parent
sample (``parent_ids``) and the parent's reward is the mean (or max) of its kept children's.
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass, replace
from typing import Any, ClassVar, Literal, Self

import torch

from unirl.config.require import require
from unirl.config.typecheck import check_config_mapping
from unirl.types import STATUS_DROPPED, RolloutTrack


@dataclass(kw_only=True)
class Stage:
    """One track and the driver-side handles that act on it.

    ``reward``: scores the track's media (a ``RewardWorker`` handle), or ``None`` when the
    track takes its reward from its children. ``stack`` / ``algorithm`` / ``ops``: train it
    (``None`` for a frozen stage). ``sync``: a dedicated engine's cadence
    (``after_train(k) -> sync/* metrics``). ``parent``: the track this one's samples descend
    from. ``prefix``: metric prefix (empty for a recipe's only or main stage, so single-stage
    metric names stay ``reward/mean``, ``train/loss``, …). ``train_ranks`` /
    ``rollout_ranks``: data-parallel sizes of its slabs. ``exports_lora``: the run ends by
    exporting its adapter; ``exports_model``: by writing the whole trained model as a
    ``save_pretrained`` folder (a full fine-tune of a transformers-loadable model).
    ``sampling_switches``: the modes whose rollouts need ``ops.begin_sampling`` /
    ``end_sampling`` (``None``: unknown, every mode).
    """

    track: str
    reward: Any = None
    stack: Any = None
    algorithm: Any = None
    ops: Any = None
    sync: Any = None
    parent: str | None = None
    reward_from_children: Literal["mean", "max"] = "mean"
    train_ranks: int = 1
    rollout_ranks: int = 1
    prefix: str = ""
    exports_lora: bool = False
    exports_model: bool = False
    # the rollout modes for which the stage's ops switch weights before sampling (filled in
    # once the roles are up: TrainOps.sampling_switches); None: not known, always switch
    sampling_switches: tuple[str, ...] | None = None

    @property
    def trains(self) -> bool:
        return self.stack is not None

    def key(self, name: str) -> str:
        """A metric name of this stage (``reward/mean`` or ``text/reward/mean``)."""
        return f"{self.prefix}/{name}" if self.prefix else name


def propagate_rewards(
    child: RolloutTrack, parent: RolloutTrack, how: Literal["mean", "max"] = "mean"
) -> RolloutTrack:
    """``parent`` with rewards aggregated from its kept children (``child.parent_ids`` name
    parent ``sample_ids``). A parent left without a kept child is dropped; the children's
    reward components are aggregated the same way."""
    if child.parent_ids is None or child.rewards is None:
        raise ValueError(
            f"reward propagation needs a child track with parent_ids and rewards "
            f"(parent_track={child.parent_track!r})"
        )
    kept = child.kept
    parent_index = {int(s): i for i, s in enumerate(parent.sample_ids.tolist())}
    unknown = sorted({int(p) for p in child.parent_ids.tolist()} - set(parent_index))
    if unknown:
        raise ValueError(
            f"child samples name parents that are not in the parent track: {unknown[:8]}"
        )
    rows = torch.tensor([parent_index[int(p)] for p in child.parent_ids.tolist()], dtype=torch.long)
    n = len(parent)

    def reduce(values: torch.Tensor) -> torch.Tensor:
        out = torch.full((n,), math.nan, dtype=torch.float32)
        for i in range(n):
            mine = values.float()[(rows == i) & kept]
            if mine.numel():
                out[i] = mine.mean() if how == "mean" else mine.max()
        return out

    rewards = reduce(child.rewards)
    components = (
        {k: reduce(v) for k, v in child.component_rewards.items()}
        if child.component_rewards
        else None
    )
    assert parent.status is not None
    status = torch.where(
        torch.isnan(rewards), torch.full_like(parent.status, STATUS_DROPPED), parent.status
    )
    rewards = torch.nan_to_num(rewards, nan=0.0)
    return replace(parent, rewards=rewards, component_rewards=components, status=status)


def kept_reward_stats(track: RolloutTrack) -> dict[str, float]:
    """``reward/mean`` and ``reward/std`` (population) over a track's kept samples: a parent
    stage's rewards after :func:`propagate_rewards` (NaN mean, 0 std when too few are kept)."""
    assert track.rewards is not None
    kept = track.rewards.float()[track.kept]
    return {
        "reward/mean": float(kept.mean()) if kept.numel() else math.nan,
        "reward/std": float(kept.std(unbiased=False)) if kept.numel() > 1 else 0.0,
    }


def order_stages(stages: list[Stage]) -> list[Stage]:
    """Stages with every child before its parent (rewards flow child -> parent); refuses a
    parent that names no stage and a cycle."""
    by_track = {s.track: s for s in stages}
    if len(by_track) != len(stages):
        raise ValueError(f"two stages share a track name: {[s.track for s in stages]}")
    for s in stages:
        if s.parent is not None and s.parent not in by_track:
            raise ValueError(f"stage {s.track!r} names parent {s.parent!r}, which is no stage")
    depth: dict[str, int] = {}

    def level(s: Stage, seen: tuple[str, ...] = ()) -> int:
        if s.track in seen:
            raise ValueError(f"stage lineage has a cycle: {' -> '.join((*seen, s.track))}")
        if s.track not in depth:
            depth[s.track] = (
                0 if s.parent is None else level(by_track[s.parent], (*seen, s.track)) + 1
            )
        return depth[s.track]

    return sorted(stages, key=lambda s: -level(s))


class ComposedStageConfig:
    """A composed recipe's typed block (``PEConfig`` as ``pe``, ``UnifiedConfig`` as
    ``unified``): a dataclass with one field holding its child stage's dataclass
    (``pe.diffusion``, ``unified.image``), whose fields without a default are the component
    blocks (``_target_`` mappings) the child must give. The class names its recipe key
    (``block_key``), its entry point, the child stage in messages (``owner``) and the recipe to
    copy (``example``); :meth:`of` checks the block and its child and builds both."""

    block_key: ClassVar[str]
    entry: ClassVar[str]
    owner: ClassVar[str]
    example: ClassVar[str]

    @classmethod
    def _child(cls) -> tuple[str, type, tuple[str, ...]]:
        """``(child field, its dataclass, the child's required component names)``."""
        hints = typing.get_type_hints(cls)
        (child,) = (f.name for f in fields(cls) if is_dataclass(hints[f.name]))  # type: ignore[arg-type]
        child_cls = hints[child]
        required = tuple(
            f.name
            for f in fields(child_cls)
            if f.default is MISSING and f.default_factory is MISSING
        )
        return child, child_cls, required

    def child(self) -> Any:
        """The child stage's typed block (``pe.diffusion``, ``unified.image``)."""
        return getattr(self, self._child()[0])

    @classmethod
    def of(cls, block: object) -> Self:
        """The typed block; one line naming the key when it is wrong or missing."""
        where = cls.block_key
        child, child_cls, components = cls._child()
        parts = ", ".join(components)
        others = "".join(f"; {where}.{f.name}" for f in fields(cls) if f.name != child)  # type: ignore[arg-type]
        require(
            isinstance(block, dict),
            f"{cls.entry} needs a `{where}` block ({where}.{child}: {cls.owner} {parts}{others}); "
            f"see {cls.example}",
        )
        assert isinstance(block, dict)
        checked = check_config_mapping(block, cls, where)
        require(
            isinstance(checked.get(child), dict),
            f"{where}.{child} is missing: give {cls.owner} {parts} blocks",
        )
        inner = check_config_mapping(checked[child], child_cls, f"{where}.{child}")
        for name in components:
            value = inner.get(name)
            require(
                isinstance(value, dict) and "_target_" in value,
                f"{where}.{child}.{name} is missing: give {cls.owner} {name} block with its "
                "_target_",
            )
        checked[child] = child_cls(**inner)
        return cls(**checked)
