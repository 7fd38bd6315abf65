"""Rank bookkeeping: who a worker is in the pool, and who a role instance is in its slab."""

from __future__ import annotations

from dataclasses import dataclass, replace

from unirl.config import require


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    """Position of one process in a group of ``world_size`` processes.

    For a pool worker ``rank == pool_rank``. For a role instance ``rank`` counts within the
    role's slab (0 .. slab size - 1) while ``pool_rank`` is the worker's rank in the pool.
    The parallel mesh is laid out outer -> inner as ``pp, dp, sp, tp``:
    ``rank = ((pp_rank * dp_size + dp_rank) * sp_size + sp_rank) * tp_size + tp_rank``.
    Expert parallelism folds into data parallelism: ``ep_rank = dp_rank % ep_size``.
    """

    rank: int
    world_size: int
    pool_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    dp_rank: int
    dp_size: int
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    sp_rank: int = 0
    sp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1

    @property
    def is_dp_leader(self) -> bool:
        """True on the one rank per data-parallel group whose output the driver gathers
        (``tp_rank == 0``, ``sp_rank == 0``, last pipeline stage)."""
        return self.tp_rank == 0 and self.sp_rank == 0 and self.pp_rank == self.pp_size - 1

    def torch_env(self) -> dict[str, str]:
        """``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` ... for ``torch.distributed`` (env://)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank),
        }


@dataclass(kw_only=True)
class ParallelSizes:
    """Model-parallel sizes of one role; data parallelism takes what is left of the slab."""

    tp: int = 1
    pp: int = 1
    sp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for field_name in ("tp", "pp", "sp", "ep"):
            value = getattr(self, field_name)
            require(
                isinstance(value, int) and value >= 1,
                f"ParallelSizes.{field_name}={value!r}: must be an integer >= 1",
            )

    def dp_size(self, world_size: int) -> int:
        """Data-parallel size for a slab of ``world_size`` workers (checked divisible)."""
        model = self.tp * self.pp * self.sp
        require(
            world_size % model == 0,
            f"ParallelSizes(tp={self.tp}, pp={self.pp}, sp={self.sp}) needs a multiple of "
            f"{model} workers but the slab has {world_size}; change the placement fraction "
            "or the parallel sizes",
        )
        dp = world_size // model
        require(
            dp % self.ep == 0,
            f"ParallelSizes.ep={self.ep} must divide the data-parallel size {dp} "
            f"(slab of {world_size} workers / tp*pp*sp={model})",
        )
        return dp


def slab_rank_infos(
    pool_infos: list[RankInfo], parallel: ParallelSizes | None = None
) -> list[RankInfo]:
    """RankInfos for a role spread over ``pool_infos`` (one per worker, slab order)."""
    parallel = parallel or ParallelSizes()
    world = len(pool_infos)
    dp = parallel.dp_size(world)
    infos = []
    for rank, worker in enumerate(pool_infos):
        tp_rank = rank % parallel.tp
        sp_rank = (rank // parallel.tp) % parallel.sp
        dp_rank = (rank // (parallel.tp * parallel.sp)) % dp
        pp_rank = rank // (parallel.tp * parallel.sp * dp)
        infos.append(
            replace(
                worker,
                rank=rank,
                world_size=world,
                dp_rank=dp_rank,
                dp_size=dp,
                tp_rank=tp_rank,
                tp_size=parallel.tp,
                pp_rank=pp_rank,
                pp_size=parallel.pp,
                sp_rank=sp_rank,
                sp_size=parallel.sp,
                ep_rank=dp_rank % parallel.ep,
                ep_size=parallel.ep,
            )
        )
    return infos


def pool_rank_infos(node_of_slot: list[int]) -> list[RankInfo]:
    """Pool-level RankInfos from the physical node index of each device slot (rank order).

    ``node_of_slot[r]`` is the (0-based, first-seen order) node hosting rank ``r``; local
    ranks count slots per node in rank order. Data parallelism spans the whole pool.
    """
    world = len(node_of_slot)
    num_nodes = len(set(node_of_slot))
    per_node: dict[int, int] = {}
    locals_ = []
    for node in node_of_slot:
        locals_.append(per_node.get(node, 0))
        per_node[node] = per_node.get(node, 0) + 1
    return [
        RankInfo(
            rank=rank,
            world_size=world,
            pool_rank=rank,
            local_rank=locals_[rank],
            local_world_size=per_node[node],
            node_rank=node,
            num_nodes=num_nodes,
            dp_rank=rank,
            dp_size=world,
        )
        for rank, node in enumerate(node_of_slot)
    ]
