"""DevicePool on a local Ray runtime: sibling sharing, dispatch modes, layouts, gloo."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
import torch
from omegaconf import OmegaConf
from unirl_group_roles import Collective, Items, Plain, Reader, Store

from unirl.distributed.group import (
    DevicePool,
    DevicePoolConfig,
    Dispatch,
    Handle,
    ParallelSizes,
    PlacementError,
    placement,
    remote,
)
from unirl.types import RolloutReq, Texts

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def pool(ray_session: None) -> Iterator[DevicePool]:
    config = DevicePoolConfig(
        num_devices=2, device="cpu", name="test", call_timeout_s=60, log_to_driver=False
    )
    with DevicePool(config) as p:
        yield p


def test_pool_ranks_env_and_threads(pool: DevicePool) -> None:
    with placement(pool):
        store = remote(Store, name="ident_store")
    idents = store.ident()
    assert [i["rank"] for i in idents] == [0, 1]
    assert [i["rank_at_init"] for i in idents] == [0, 1]
    assert [i["env_rank"] for i in idents] == ["0", "1"]
    assert idents[0]["master"] == idents[1]["master"]
    assert idents[0]["master"].startswith(f"{pool.node_ips[0]}:")  # rank 0's node ip
    assert [i["threads"] for i in idents] == [1, 1]  # torch.set_num_threads(cpus_per_worker)
    assert idents[0]["pid"] != idents[1]["pid"]
    assert [(i.node_rank, i.local_rank) for i in pool.rank_infos] == [(0, 0), (0, 1)]


def test_siblings_share_one_python_object(pool: DevicePool) -> None:
    with placement(pool):
        store = remote(Store, name="store")
        cfg = OmegaConf.create({"_target_": "unirl_group_roles.Reader", "offset": 5})
        reader = remote(cfg, name="reader", store=store)
    assert reader.store_obj_id() == [i["obj_id"] for i in store.ident()]
    reader.push(7)
    assert store.items_seen() == [[(0, 7)], [(1, 7)]]
    assert reader.who() == 0  # RANK_ZERO returns rank 0's result only
    assert reader.methods["double"].dispatch is Dispatch.DP_SCATTER


def test_dp_scatter_concatenates_in_rank_order(pool: DevicePool) -> None:
    with placement(pool):
        store = remote(Store, name="scatter_store")
        reader = remote(Reader, name="scatter_reader", store=store, offset=100)
    out = reader.double(Items([1, 2, 3, 4], [9, 9, 9, 9]), [0, 10, 20, 30], bias=1)
    # rank 0 gets samples 0-1, rank 1 gets 2-3; value = 2v + bias + offset + extra
    assert out == Items([103, 115, 127, 139], [0, 0, 1, 1])
    with pytest.raises(ValueError) as err:
        reader.double(Items([1, 2, 3], [0, 0, 0]), [0, 0, 0])
    assert str(err.value) == (
        "cannot split batch of 3 across 2 data-parallel ranks of role 'scatter_reader' "
        "(method double); make batch divisible"
    )


def test_dp_scatter_of_a_rollout_request(pool: DevicePool) -> None:
    with placement(pool):
        store = remote(Store, name="req_store")
        reader = remote(Reader, name="req_reader", store=store)
    prompts = ["a", "b", "c", "d", "e", "f"]
    req = RolloutReq(
        sample_ids=torch.arange(10, 16),
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2]),
        primitives={"text": Texts(texts=prompts)},
        seed=3,
    )
    out = reader.tag_request(req)
    assert isinstance(out, RolloutReq)
    assert out.sample_ids.tolist() == list(range(10, 16))
    assert out.seed == 3
    assert out.metadata == [{"rank": r, "prompt": p} for r, p in zip([0, 0, 0, 1, 1, 1], prompts)]
    with pytest.raises(ValueError, match="cannot split batch of 5 across 2 data-parallel ranks"):
        reader.tag_request(req.select([0, 1, 2, 3, 4]))


def test_dp_scatter_with_tensor_parallel_sends_whole_batch_and_gathers_tp_rank0(
    pool: DevicePool,
) -> None:
    with placement(pool):
        store = remote(Store, name="tp_store")
        reader = remote(Reader, name="tp_reader", parallel=ParallelSizes(tp=2), store=store)
    assert reader.dp_size == 1
    assert reader.double(Items([1, 2], [0, 0]), [0, 0]) == Items([2, 4], [0, 0])


def test_plain_class_role_and_plan(pool: DevicePool) -> None:
    with placement(pool, 0.5):
        plain = remote(Plain, name="plain", label="x")
    assert plain.describe() == ["x:0/1"]
    plan = pool.describe_plan()
    assert "role 'plain'  pool ranks" in plan
    assert f"({pool.node_ips[0]})  local 0  cpu" in plan


def test_separate_layout_uses_disjoint_workers_and_overlaps_calls(pool: DevicePool) -> None:
    with placement(pool, 0.5):
        left = remote(Store, name="left_store")
        left_reader = remote(Reader, name="left", store=left)
    with placement(pool, 0.5):
        right = remote(Store, name="right_store")
        right_reader = remote(Reader, name="right", store=right)
    assert sorted(left.pool_ranks + right.pool_ranks) == [0, 1]
    (left_ident,), (right_ident,) = left.ident(), right.ident()
    assert left_ident["actor_id"] != right_ident["actor_id"]
    assert left_ident["pool_rank"] == left.pool_ranks[0]
    assert left_ident["rank"] == right_ident["rank"] == 0
    start = time.monotonic()
    pending = [left_reader.call_async("nap", 0.8), right_reader.call_async("nap", 0.8)]
    assert Handle.wait(*pending) == [[0.8], [0.8]]
    assert time.monotonic() - start < 1.5  # the two naps ran at the same time


def test_gloo_all_reduce_world_and_subgroup(pool: DevicePool) -> None:
    with placement(pool):
        everyone = remote(Collective, name="coll_all")
    everyone.init_process_group(timeout_s=30)
    assert everyone.all_reduce(3.0) == [6.0, 6.0]
    assert everyone.group_size() == [2, 2]
    with placement(pool, devices=1):
        single = remote(Collective, name="coll_one")
    single.init_process_group(timeout_s=30)
    assert single.group_size() == [1]
    assert single.all_reduce(5.0) == [5.0]


def test_pool_larger_than_cluster_fails_fast(ray_session: None) -> None:
    start = time.monotonic()
    with pytest.raises(PlacementError) as err:
        DevicePool(DevicePoolConfig(num_devices=16, device="cpu", name="huge", log_to_driver=False))
    assert time.monotonic() - start < 5.0
    message = str(err.value)
    assert message.startswith(
        "DevicePool 'huge' asks for 16 cpu device(s) as 4 node(s) x 4 (bundle {'CPU': 1.0}), "
        "but the cluster can host only 1 such node group(s): 1 alive node(s): "
    )
    assert re.search(r"CPU=4 GPU=\d+ -> fits 4\. Lower num_devices", message)
