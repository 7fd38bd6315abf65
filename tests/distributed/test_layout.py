"""Slab arithmetic, rank meshes, dispatch splitting and the printed plan: no Ray needed."""

from __future__ import annotations

import pytest
from unirl_group_roles import Items, Reader, Store

from unirl.config import ConfigError
from unirl.distributed.group import (
    DevicePoolConfig,
    DryRunPool,
    ParallelSizes,
    placement,
    remote,
)
from unirl.distributed.group.dispatch import gather_results, scatter_args
from unirl.distributed.group.rank import pool_rank_infos, slab_rank_infos


def test_separate_layout_gives_disjoint_slabs() -> None:
    pool = DryRunPool(DevicePoolConfig(num_devices=4))
    with placement(pool, 0.5) as train:
        pass
    with placement(pool, 0.5) as roll:
        pass
    assert train.ranks == (0, 1)
    assert roll.ranks == (2, 3)


def test_colocated_blocks_wrap_onto_the_same_workers() -> None:
    pool = DryRunPool(DevicePoolConfig(num_devices=4))
    with placement(pool) as first:
        pass
    with placement(pool) as second:
        pass
    assert first.ranks == second.ranks == (0, 1, 2, 3)


def test_nested_blocks_claim_sub_slabs_of_the_enclosing_slab() -> None:
    pool = DryRunPool(DevicePoolConfig(num_devices=8))
    with placement(pool, 0.5):
        pass
    with placement(pool, 0.5) as outer:
        with placement(pool, 0.5) as a:
            pass
        with placement(pool, devices=2) as b:
            pass
    assert outer.ranks == (4, 5, 6, 7)
    assert a.ranks == (4, 5)
    assert b.ranks == (6, 7)


def test_exclusive_block_refuses_to_overlap() -> None:
    pool = DryRunPool(DevicePoolConfig(num_devices=4))
    with placement(pool, 0.5, shared_workers=False):
        pass
    with placement(pool, 0.5):
        pass
    with (
        pytest.raises(ConfigError, match=r"only 0 of 4 .* are unclaimed"),
        placement(pool, 0.5, shared_workers=False),
    ):
        pass
    with pytest.raises(ConfigError, match="shared_workers=False"), placement(pool, 0.5):
        pass  # would wrap onto the exclusive slab at ranks 0-1


def test_fraction_must_give_whole_devices() -> None:
    pool = DryRunPool(DevicePoolConfig(num_devices=4))
    with (
        pytest.raises(ConfigError, match=r"fraction=0.3\) of a 4-device slab is 1.2 devices"),
        placement(pool, 0.3),
    ):
        pass


def test_remote_outside_placement_and_sibling_on_other_workers_fail() -> None:
    pool = DryRunPool(DevicePoolConfig(num_devices=4))
    with pytest.raises(RuntimeError, match="inside `with placement"):
        remote(Store)
    with placement(pool, 0.5):
        store = remote(Store, name="store")
    with placement(pool, 0.5), pytest.raises(ConfigError) as err:
        remote(Reader, name="reader", store=store)
    assert str(err.value) == (
        "sibling 'store' (role 'store') lives on pool ranks [0, 1] but role 'reader' is placed "
        "on pool ranks [2, 3] (missing there: [2, 3]); create both inside the same placement block"
    )


def test_describe_plan_lists_roles_ranks_nodes_devices() -> None:
    pool = DryRunPool(
        DevicePoolConfig(num_devices=4, devices_per_node=2, device="cuda", name="demo")
    )
    with placement(pool, 0.5):
        store = remote(Store, name="trainer")
        remote({"_target_": "unirl_group_roles.Reader"}, name="ref", store=store)
    with placement(pool, 0.5):
        remote(Reader, name="rollout", parallel=ParallelSizes(tp=2), store=None)
    assert pool.describe_plan().splitlines() == [
        "DevicePool 'demo': 4 x cuda on 2 node(s), bundle {'GPU': 1.0, 'CPU': 1.0}",
        "  role 'trainer'  pool ranks 0-1  dp=2 tp=1 pp=1 sp=1 ep=1",
        "    rank 0 -> worker 0  node 0 (node0)  local 0  cuda (slot 0)",
        "    rank 1 -> worker 1  node 0 (node0)  local 1  cuda (slot 1)",
        "  role 'ref'  pool ranks 0-1  dp=2 tp=1 pp=1 sp=1 ep=1",
        "    rank 0 -> worker 0  node 0 (node0)  local 0  cuda (slot 0)",
        "    rank 1 -> worker 1  node 0 (node0)  local 1  cuda (slot 1)",
        "  role 'rollout'  pool ranks 2-3  dp=1 tp=2 pp=1 sp=1 ep=1",
        "    rank 0 -> worker 2  node 1 (node1)  local 0  cuda (slot 0)",
        "    rank 1 -> worker 3  node 1 (node1)  local 1  cuda (slot 1)",
    ]


def test_rank_mesh_layout_pp_dp_sp_tp() -> None:
    pool_infos = pool_rank_infos([0] * 4 + [1] * 4)
    assert [(i.node_rank, i.local_rank, i.local_world_size) for i in pool_infos[3:5]] == [
        (0, 3, 4),
        (1, 0, 4),
    ]
    infos = slab_rank_infos(pool_infos, ParallelSizes(tp=2, pp=2, ep=2))
    assert [(i.pp_rank, i.dp_rank, i.tp_rank, i.ep_rank) for i in infos] == [
        (0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 1), (0, 1, 1, 1),
        (1, 0, 0, 0), (1, 0, 1, 0), (1, 1, 0, 1), (1, 1, 1, 1),
    ]  # fmt: skip
    assert [i.rank for i in infos if i.is_dp_leader] == [4, 6]
    with pytest.raises(ConfigError, match="needs a multiple of 4 workers but the slab has 6"):
        slab_rank_infos(pool_infos[:6], ParallelSizes(tp=2, pp=2))


def test_scatter_splits_batches_and_lists_and_broadcasts_the_rest() -> None:
    batch = Items([1, 2, 3, 4], [0, 0, 0, 0])
    parts = scatter_args((batch, 7), {"extra": [10, 20, 30, 40]}, 2, role="r", method="m")
    assert parts == [
        ((Items([1, 2], [0, 0]), 7), {"extra": [10, 20]}),
        ((Items([3, 4], [0, 0]), 7), {"extra": [30, 40]}),
    ]
    with pytest.raises(ValueError) as err:
        scatter_args((Items(list(range(10)), [0] * 10),), {}, 4, role="rollout", method="generate")
    assert str(err.value) == (
        "cannot split batch of 10 across 4 data-parallel ranks of role 'rollout' "
        "(method generate); make batch divisible"
    )
    with pytest.raises(ValueError, match=r"different lengths \(arg 0=4, extra=2\)"):
        scatter_args((batch,), {"extra": [1, 2]}, 2, role="r", method="m")


def test_gather_concats_batches_flattens_lists() -> None:
    assert gather_results([Items([1], [0]), Items([2], [1])]) == Items([1, 2], [0, 1])
    assert gather_results([[1, 2], [3]]) == [1, 2, 3]
    assert gather_results([None, None]) is None
    assert gather_results([{"a": 1}, {"a": 2}]) == [{"a": 1}, {"a": 2}]


def test_ensure_ray_joins_cluster_without_resource_arguments(monkeypatch) -> None:
    import ray

    from unirl.distributed.group import ensure_ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert ensure_ray(num_cpus=8, log_to_driver=False) == "joined"
    assert calls[-1] == {"address": "10.1.2.3:6379", "logging_level": 40, "log_to_driver": False}
    monkeypatch.delenv("RAY_ADDRESS")
    assert ensure_ray(num_cpus=8, log_to_driver=False) == "started"
    assert calls[-1] == {
        "address": "local",
        "num_cpus": 8,
        "num_gpus": None,
        "_node_ip_address": "127.0.0.1",
        "include_dashboard": False,
        "logging_level": 40,
        "log_to_driver": False,
    }


def test_role_side_names_import_without_ray_or_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from unirl.distributed.group import distributed, Dispatch, Remote, RankInfo, current_rank_info\n"
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
