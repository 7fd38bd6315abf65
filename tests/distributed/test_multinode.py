"""Two simulated nodes (ray.cluster_utils.Cluster) in a subprocess, so its Ray runtime never
meets the session one: DevicePool(2, devices_per_node=1) must put one worker on each node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from ray_env import quiet_ray_env

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent(
    """
    import json, logging
    import ray
    from ray.cluster_utils import Cluster
    from unirl.distributed.group import DevicePool, DevicePoolConfig, placement, remote
    from unirl_group_roles import Store

    # No node_ip_address=127.0.0.1 here: ray.init rewrites a loopback bootstrap address to
    # the host's ip, so a driver cannot join a Cluster whose GCS listens on 127.0.0.1 only.
    node_args = {"num_cpus": 1, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        config = DevicePoolConfig(num_devices=2, devices_per_node=1, device="cpu",
                                  name="two_nodes", call_timeout_s=60, log_to_driver=False)
        with DevicePool(config) as pool:
            with placement(pool):
                store = remote(Store, name="store")
            print(json.dumps({
                "node_ids": [w["node_id"] for w in pool.worker_info],
                "node_ranks": [i.node_rank for i in pool.rank_infos],
                "local_ranks": [i.local_rank for i in pool.rank_infos],
                "roles": [i["rank"] for i in store.ident()],
                "cluster_nodes": len([n for n in ray.nodes() if n["Alive"]]),
            }))
    finally:
        ray.shutdown()
        cluster.shutdown()
    """
)


def test_two_node_cluster_places_one_worker_per_node(tmp_path) -> None:
    env = {**os.environ, **quiet_ray_env()}
    env.pop("RAY_ADDRESS", None)
    script = tmp_path / "two_nodes.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a hang can be cleaned up whole
    )
    try:
        stdout, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # lets Cluster.shutdown() run
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"two-node script hung; stderr tail:\n{stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["cluster_nodes"] == 2
    assert len(set(result["node_ids"])) == 2
    assert result["node_ranks"] == [0, 1]
    assert result["local_ranks"] == [0, 0]
    assert result["roles"] == [0, 1]
