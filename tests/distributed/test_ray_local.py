"""A cluster that ``ray start`` (or ``Cluster``) registered on the machine is never joined
unasked: with ``RAY_ADDRESS`` unset, the driver starts its own local Ray.

Ray writes a started head's address to ``<RAY_TMPDIR>/ray/ray_current_cluster`` and a bare
``ray.init()`` connects to it (then refuses ``num_cpus``). The subprocess points
``RAY_TMPDIR`` at the test's own folder, so the file and the head are its alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
from ray_env import quiet_ray_env

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent(
    """
    import json
    import ray
    from ray._private.utils import read_ray_address
    from ray.cluster_utils import Cluster
    from unirl.distributed.group import ensure_ray

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        registered = read_ray_address()
        mode = ensure_ray(num_cpus=1, log_to_driver=False)
        print(json.dumps({
            "registered": registered,
            "head": cluster.address,
            "mode": mode,
            "joined": ray.get_runtime_context().gcs_address,
        }))
    finally:
        ray.shutdown()
        cluster.shutdown()
    """
)


def test_registered_local_cluster_is_not_joined_without_ray_address(tmp_path) -> None:
    # Ray's socket paths must stay under 107 bytes: a short private folder, not tmp_path
    ray_tmp = tempfile.mkdtemp(prefix="rl", dir="/tmp")
    env = {**os.environ, **quiet_ray_env(), "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    script = tmp_path / "local.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["registered"] == out["head"]  # the trap is set: a bare ray.init() would join it
    assert out["mode"] == "started"
    assert out["joined"] != out["head"]
