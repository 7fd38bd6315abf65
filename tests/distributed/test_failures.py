"""Failure semantics: a raising role, a call past its timeout and a dead worker all raise
RemoteCallError in the driver, naming role, method and rank, without hanging."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
import ray
from unirl_group_roles import Faulty, Store

from unirl.distributed.group import (
    DevicePool,
    DevicePoolConfig,
    RemoteCallError,
    placement,
    remote,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def pool(ray_session: None) -> Iterator[DevicePool]:
    # Tests in this module run in order and leave the pool damaged: raise, time out, kill.
    config = DevicePoolConfig(
        num_devices=2, device="cpu", name="faulty", call_timeout_s=20, log_to_driver=False
    )
    with DevicePool(config) as p:
        yield p


@pytest.fixture(scope="module")
def faulty(pool: DevicePool):
    with placement(pool):
        return remote(Faulty, name="faulty")


def test_exception_in_role_names_role_method_rank_and_traceback(faulty) -> None:
    start = time.monotonic()
    with pytest.raises(RemoteCallError) as err:
        faulty.boom()
    assert time.monotonic() - start < 5.0
    message = str(err.value)
    assert message.startswith("role 'faulty' method 'boom' failed on rank 1 (pool rank 1, node ")
    assert "ValueError: boom on purpose" in message
    assert "Traceback (most recent call last)" in message
    assert 'raise ValueError("boom on purpose")' in err.value.remote_traceback
    assert (err.value.role, err.value.method, err.value.ranks) == ("faulty", "boom", [1])
    assert faulty.ok() == [0, 1]  # a raising method leaves the workers usable


def test_constructor_error_is_reported_with_role_name(pool: DevicePool) -> None:
    with pytest.raises(RemoteCallError) as err, placement(pool):
        remote(Store, name="bad_store", scale=1, not_an_arg=2)
    # both ranks fail; whichever lands first is reported
    assert re.match(r"role 'bad_store' method '__init__' failed on rank [01] ", str(err.value))
    assert "TypeError: Store.__init__() got an unexpected keyword argument 'not_an_arg'" in str(
        err.value
    )
    assert "bad_store" not in pool.roles


def test_call_past_timeout_raises_within_the_timeout(faulty) -> None:
    start = time.monotonic()
    with pytest.raises(RemoteCallError) as err:
        faulty.slow()  # sleeps 3 s, timeout_s=0.5 from the decorator
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 1.5
    assert str(err.value).startswith(
        "role 'faulty' method 'slow' timed out after 0.5 s on rank(s) [0, 1]: rank 0 (pool rank 0"
    )
    with pytest.raises(RemoteCallError, match=r"timed out after 0\.2 s"):
        faulty.options(timeout_s=0.2).ok()  # queued behind the sleeping call


def test_collective_missing_a_peer_fails_after_its_timeout(faulty) -> None:
    faulty.init_process_group(timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(RemoteCallError) as err:
        faulty.lonely_all_reduce()
    assert time.monotonic() - start < 8.0  # 2 s gloo timeout (+ the slow call still draining)
    print(err.value)
    assert str(err.value).startswith(
        "role 'faulty' method 'lonely_all_reduce' failed on rank 0 (pool rank 0, node "
    )
    assert err.value.ranks == [0]


def test_killed_worker_raises_naming_the_rank(pool: DevicePool, faulty) -> None:
    ray.kill(pool.actor(1), no_restart=True)
    start = time.monotonic()
    with pytest.raises(RemoteCallError) as err:
        faulty.ok()
    assert time.monotonic() - start < 10.0
    message = str(err.value)
    assert message.startswith("role 'faulty' method 'ok' failed on rank 1 (pool rank 1, node ")
    assert "its worker process died or is unreachable" in message
    assert err.value.ranks == [1]
    with pytest.raises(RemoteCallError, match=r"method 'ping' failed on rank 1"):
        pool.ping(timeout_s=10)
