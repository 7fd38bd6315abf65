"""CUDA path: one GPU per worker via Ray, NCCL all_reduce, DP_SCATTER on device tensors.
Needs >= 2 GPUs; skipped on CPU machines."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from unirl_group_roles import Items

from unirl.distributed.group import (
    DevicePool,
    DevicePoolConfig,
    Dispatch,
    Remote,
    distributed,
    placement,
    remote,
)

pytestmark = [
    pytest.mark.ray,
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]


class GpuRole(Remote):
    def __init__(self) -> None:
        self.x = torch.full((4,), float(self.rank_info.rank + 1), device="cuda")

    @distributed
    def visible(self) -> tuple[str | None, int, int]:
        return (
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            torch.cuda.device_count(),
            torch.cuda.current_device(),
        )

    @distributed
    def all_reduce(self) -> list[float]:
        import torch.distributed as dist

        y = self.x.clone()
        dist.all_reduce(y, group=self.process_group)
        return y.tolist()

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def scale(self, batch: Items) -> Items:
        values = torch.tensor(batch.values, device="cuda") * 10
        return Items(values.tolist(), [self.rank_info.rank] * len(batch))


@pytest.fixture(scope="module")
def gpu_pool(ray_session: None) -> Iterator[DevicePool]:
    config = DevicePoolConfig(
        num_devices=2, device="cuda", name="gpu", call_timeout_s=120, log_to_driver=False
    )
    with DevicePool(config) as p:
        yield p


def test_each_worker_sees_its_own_gpu_and_nccl_all_reduce(gpu_pool: DevicePool) -> None:
    with placement(gpu_pool):
        role = remote(GpuRole, name="gpu_role")  # defined in this module: pickled by value
    visible = role.visible()
    assert [count for _, count, _ in visible] == [1, 1]
    assert [current for _, _, current in visible] == [0, 0]
    assert visible[0][0] != visible[1][0]  # different physical GPUs
    assert [w["gpu_ids"] for w in gpu_pool.worker_info] == [[v[0]] for v in visible]
    role.init_process_group(timeout_s=120)
    assert role.all_reduce() == [[3.0] * 4, [3.0] * 4]
    assert role.scale(Items([0, 1, 2, 3], [0] * 4)) == Items([0, 10, 20, 30], [0, 0, 1, 1])
