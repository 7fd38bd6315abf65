"""``BatchGeometry``: how one rollout's samples split over ranks, mini- and micro-batches.

Built once from typed objects (``RunConfig``, the sampling params and the stack's config that
``validate`` builds), never from block dicts with copied defaults: the validators check it and
``dry_run`` prints it, so both read the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unirl.config.require import require
from unirl.config.run import RunConfig


@dataclass(frozen=True, kw_only=True)
class BatchGeometry:
    """The batch arithmetic of one rollout (``train_ranks`` / ``rollout_ranks``: the
    data-parallel sizes of the two slabs, ``RunConfig.slab_sizes``)."""

    prompts_per_rollout: int
    samples_per_prompt: int
    train_ranks: int
    rollout_ranks: int
    num_updates_per_batch: int
    micro_batch_size: int

    @classmethod
    def of(cls, cfg: RunConfig, objs: Mapping[str, Any]) -> BatchGeometry:
        """The geometry of a validated recipe: ``objs["sampling"]`` (the sampling params) and
        ``objs["stack"]`` (the stack's typed config), as ``validate`` builds them."""
        stack = objs.get("stack")
        require(
            hasattr(stack, "micro_batch_size") and hasattr(stack, "num_updates_per_batch"),
            f"stack._target_={_target(stack)} declares no config_class with micro_batch_size "
            "and num_updates_per_batch; a train stack takes its knobs as one typed config "
            "(see unirl/config/README.md)",
        )
        assert stack is not None  # the require above refuses a missing stack
        train, rollout = cfg.slab_sizes()
        return cls(
            prompts_per_rollout=cfg.batch_size,
            samples_per_prompt=int(objs["sampling"].samples_per_prompt),
            train_ranks=train,
            rollout_ranks=rollout,
            num_updates_per_batch=int(stack.num_updates_per_batch),
            micro_batch_size=int(stack.micro_batch_size),
        )

    @property
    def samples_per_rollout(self) -> int:
        return self.prompts_per_rollout * self.samples_per_prompt

    @property
    def samples_per_train_rank(self) -> int:
        return self.samples_per_rollout // max(self.train_ranks, 1)

    @property
    def samples_per_rollout_rank(self) -> int:
        return self.samples_per_rollout // max(self.rollout_ranks, 1)

    @property
    def mini_batch_per_rank(self) -> int:
        return self.samples_per_train_rank // self.num_updates_per_batch

    @property
    def micro_batches_per_step(self) -> int:
        return self.mini_batch_per_rank // self.micro_batch_size


def _target(block: object) -> str:
    return str(block.get("_target_", "?")) if isinstance(block, dict) else type(block).__name__
