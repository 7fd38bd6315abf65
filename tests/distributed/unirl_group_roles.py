"""Role classes for tests/distributed (imported by the Ray workers via PYTHONPATH)."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

import ray
import torch
import torch.distributed as dist

from unirl.distributed.group import Dispatch, Remote, current_rank_info, distributed
from unirl.types import RolloutReq


@dataclass
class Items:
    """Minimal Batch-like container: ``chunk``, ``concat``, ``len``."""

    values: list[int]
    tags: list[int]

    def __len__(self) -> int:
        return len(self.values)

    def chunk(self, n: int) -> list[Items]:
        size = len(self) // n
        return [
            Items(self.values[i * size : (i + 1) * size], self.tags[i * size : (i + 1) * size])
            for i in range(n)
        ]

    @classmethod
    def concat(cls, parts: list[Items]) -> Items:
        return cls([v for p in parts for v in p.values], [t for p in parts for t in p.tags])


class Store(Remote):
    """Holds a list other roles on the same worker mutate."""

    def __init__(self, scale: int = 1) -> None:
        self.items: list[tuple[int, int]] = []
        self.scale = scale
        self.rank_at_init = current_rank_info().rank

    @distributed
    def ident(self) -> dict[str, int | str]:
        return {
            "obj_id": id(self),
            "pid": os.getpid(),
            "actor_id": ray.get_runtime_context().get_actor_id(),
            "rank": self.rank_info.rank,
            "pool_rank": self.rank_info.pool_rank,
            "rank_at_init": self.rank_at_init,
            "threads": torch.get_num_threads(),
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "env_rank": os.environ["RANK"],
        }

    @distributed
    def items_seen(self) -> list[tuple[int, int]]:
        return list(self.items)


class Reader(Remote):
    """Sibling of Store: receives the Store instance living on the same worker."""

    def __init__(self, store: Store, offset: int = 0) -> None:
        self.store = store
        self.offset = offset

    @distributed
    def store_obj_id(self) -> int:
        return id(self.store)

    @distributed
    def push(self, value: int) -> None:
        self.store.items.append((self.rank_info.rank, value))

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def double(self, batch: Items, extra: list[int], bias: int = 0) -> Items:
        info = self.rank_info
        return Items(
            [2 * v + bias + self.offset + e for v, e in zip(batch.values, extra)],
            [info.rank] * len(batch),
        )

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def tag_request(self, req: RolloutReq) -> RolloutReq:
        """Returns ``req`` with each sample's metadata saying which rank saw which prompt."""
        meta = [{"rank": self.rank_info.rank, "prompt": p} for p in req.prompts]
        return dataclasses.replace(req, metadata=meta)

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def who(self) -> int:
        return self.rank_info.rank

    @distributed
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class Collective(Remote):
    @distributed
    def all_reduce(self, value: float) -> float:
        tensor = torch.tensor([value])
        dist.all_reduce(tensor, group=self.process_group)
        return float(tensor.item())

    @distributed
    def group_size(self) -> int:
        return dist.get_world_size(group=self.process_group)


class Faulty(Remote):
    @distributed
    def boom(self) -> int:
        if self.rank_info.rank == 1:
            raise ValueError("boom on purpose")
        return self.rank_info.rank

    @distributed(timeout_s=0.5)
    def slow(self) -> None:
        time.sleep(3.0)

    @distributed
    def ok(self) -> int:
        return self.rank_info.rank

    @distributed
    def lonely_all_reduce(self) -> float:
        """Only rank 0 enters the collective, so it waits for a peer that never comes."""
        tensor = torch.ones(1)
        if self.rank_info.rank == 0:
            dist.all_reduce(tensor, group=self.process_group)
        return float(tensor.item())


class Plain:
    """A role that does not derive from Remote (uses current_rank_info())."""

    def __init__(self, label: str) -> None:
        self.label = label

    @distributed(dispatch=Dispatch.BROADCAST)
    def describe(self) -> str:
        return f"{self.label}:{current_rank_info().rank}/{current_rank_info().world_size}"
