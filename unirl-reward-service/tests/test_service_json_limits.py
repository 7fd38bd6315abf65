"""At the default server limits (64 MB bodies), a body of millions of empty JSON objects is
refused (413) from its raw bytes before it is parsed: the reported attack (a 60 MB body of
``{}`` in ``metadata``) added 3.0 GB to the server's RSS; here the peak stays under the
hardening tests' 100 MB bound. Deep nesting is refused the same way."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from test_service_hardening import RSS_BOUND_MB, _free_port, one_bit_png, peak_rss_rise_mb

from unirl_reward_service.middleware import json_shape_problem

TOKEN = "json-limits-token-51c0"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REWARD = "secret_brightness_reward"  # the name assert_scores posts to
CONFIG = f"""
server:
  auth_token_env: UNIRL_JSON_TOKEN
rewards:
  {REWARD}: {{_target_: unirl.reward.local.BrightnessTarget}}
  stats: {{_target_: unirl.reward.local.ImageStats}}
"""
# the README's promise: decoded pixels in flight at 3 bytes each, 15 while scored (2 GB at
# the default max_inflight_pixels)
STATED_BOUND_MB = 15 * 2**27 / 2**20


@pytest.fixture(scope="module")
def default_server(tmp_path_factory) -> Iterator[tuple[str, int]]:
    folder = tmp_path_factory.mktemp("json_limits")
    (folder / "service.yaml").write_text(CONFIG)
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "unirl_reward_service",
        "--config",
        str(folder / "service.yaml"),
    ]
    command += ["--port", str(port)]
    env = {**os.environ, "UNIRL_JSON_TOKEN": TOKEN}
    with (folder / "server.log").open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert process.poll() is None, (folder / "server.log").read_text()
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(20)


def test_shape_of_the_raw_body() -> None:
    assert json_shape_problem(b'{"a": [{"b": 1}, {}]}', 64, 4) is None
    assert json_shape_problem(b"[" + b"{}," * 100 + b"{}]", 64, 4) == (
        "request body holds 102 JSON objects / arrays, over server.max_json_items=64; send "
        "fewer samples per request (metadata objects count too)"
    )
    assert json_shape_problem(b"[" * 10 + b"]" * 10, 64, 4) == (
        "request body nests JSON 10 levels deep, over server.max_json_depth=4; flatten the metadata"
    )


def test_60_mb_of_empty_objects_is_413_before_parsing(default_server) -> None:
    url, pid = default_server
    count = 20_000_000  # 60 MB of '{},'
    body = b'{"reward": "%s", "images": ["AAAA"], "metadata": [' % REWARD.encode()
    body += b"{}," * (count - 1) + b"{}]}"
    assert len(body) < 64 * 1024 * 1024  # inside the default max_request_bytes
    with peak_rss_rise_mb(pid) as rise:
        answer = httpx.post(
            url + "/score",
            content=body,
            headers={**AUTH, "Content-Type": "application/json"},
            timeout=120,
        )
    assert answer.status_code == 413, answer.text[:500]
    assert answer.json()["detail"] == (
        f"request body holds {count + 3} JSON objects / arrays, over server.max_json_items=65536; "
        "send fewer samples per request (metadata objects count too)"
    )
    print(f"60 MB of empty objects: 413, server peak RSS +{rise['mb']:.1f} MB")
    assert rise["mb"] < RSS_BOUND_MB, rise


def test_four_4096_images_to_image_stats_stay_under_the_stated_bound(default_server) -> None:
    """The reported request: an 11 KB body of four 4096x4096 images (inside the default pixel
    budgets) to the image-statistics reward took the server to 7.0 GB; the reward now works a
    block of rows at a time."""
    url, pid = default_server
    body = {"reward": "stats", "images": [one_bit_png(4096)] * 4}
    with peak_rss_rise_mb(pid) as rise:
        answer = httpx.post(url + "/score", json=body, headers=AUTH, timeout=300)
    assert answer.status_code == 200, answer.text[:500]
    samples = answer.json()["results"]["stats"]["samples"]
    assert [s["error"] for s in samples] == [None] * 4
    print(f"four 4096x4096 images to ImageStats: 200, server peak RSS +{rise['mb']:.0f} MB")
    assert rise["mb"] < STATED_BOUND_MB, rise
