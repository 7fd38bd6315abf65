"""YAML config parsing, ``_target_`` building, and the ``unirl-reward-service`` command."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from unirl.config import ConfigError
from unirl.reward import WeightedRewardBackend
from unirl.reward.local import ImageStats, JpegCompressibility

from unirl_reward_service import create_app, load_config, parse_config
from unirl_reward_service.cli import build_parser, resolve_config
from unirl_reward_service.config import instantiate

YAML = """
server:
  port: 8711
  max_batch_size: 64
  auth_token_env: UNIRL_TEST_REWARD_TOKEN
rewards:
  jpeg:
    _target_: unirl.reward.local.JpegCompressibility
    quality: 90
    replicas: 2
    timeout_s: 5
    max_batch_size: 16
  combo:
    _target_: unirl.reward.WeightedRewardBackend
    components:
      jpeg: {_target_: unirl.reward.local.JpegCompressibility}
      stats: {_target_: unirl.reward.local.ImageStats}
    weights: {jpeg: 1.0, stats/dark_fraction: 0.0, stats/color_entropy: 0.0, stats/edge_density: 0.0}
"""


def test_yaml_config_round_trip(tmp_path):
    path = tmp_path / "service.yaml"
    path.write_text(YAML)
    config = load_config(path)
    assert config.server.host == "127.0.0.1"  # loopback unless told otherwise
    assert config.server.port == 8711
    assert config.server.max_batch_size == 64
    jpeg = config.rewards["jpeg"]
    assert (jpeg.replicas, jpeg.timeout_s, jpeg.max_batch_size) == (2, 5, 16)
    assert jpeg.scorer == {"_target_": "unirl.reward.local.JpegCompressibility", "quality": 90}
    scorer = jpeg.build()
    assert isinstance(scorer, JpegCompressibility) and scorer.quality == 90
    combo = config.rewards["combo"].build()
    assert isinstance(combo, WeightedRewardBackend)
    assert isinstance(combo.components["stats"], ImageStats)

    args = build_parser().parse_args(["--config", str(path), "--host", "0.0.0.0", "--port", "0"])
    overridden = resolve_config(args)
    assert (overridden.server.host, overridden.server.port) == ("0.0.0.0", 0)
    assert overridden.server.max_batch_size == 64


def test_shipped_example_config_builds(monkeypatch):
    monkeypatch.setenv("UNIRL_REWARD_TOKEN", "example-token")
    path = Path(__file__).resolve().parents[1] / "configs" / "example.yaml"
    app = create_app(load_config(path))
    try:
        info = app.state.reward_server.info()
    finally:
        app.state.reward_server.close()
    by_name = {r.name: r for r in info.rewards}
    assert list(by_name) == [
        "ocr",
        "jpeg_compressibility",
        "jpeg_incompressibility",
        "image_stats",
        "ocr_with_guard",
    ]
    assert by_name["ocr"].replicas == 2 and by_name["ocr"].max_batch_size == 16
    assert by_name["ocr_with_guard"].has_total and by_name["ocr_with_guard"].components == [
        "ocr",
        "stats/dark_fraction",
        "stats/color_entropy",
        "stats/edge_density",
    ]
    assert info.auth is True  # the shipped config reads its token from UNIRL_REWARD_TOKEN


def test_config_errors_name_the_field():
    base = {
        "server": {"require_auth": False},
        "rewards": {"jpeg": {"_target_": "unirl.reward.local.JpegCompressibility"}},
    }
    with pytest.raises(ConfigError, match=r"unknown top-level keys \['serve'\]"):
        parse_config({**base, "serve": {}})
    with pytest.raises(ConfigError, match=r"server: unknown keys \['max_bytes'\]"):
        parse_config({**base, "server": {"max_bytes": 1}})
    with pytest.raises(ConfigError, match=r"rewards\.jpeg\.replicas must be >= 1"):
        parse_config({**base, "rewards": {"jpeg": {**base["rewards"]["jpeg"], "replicas": 0}}})
    with pytest.raises(
        ConfigError, match=r"rewards\.jpeg: give the scorer as a block with _target_"
    ):
        parse_config({**base, "rewards": {"jpeg": {"quality": 90}}})
    with pytest.raises(ConfigError, match="may only use letters"):
        parse_config({**base, "rewards": {"a b": base["rewards"]["jpeg"]}})
    with pytest.raises(ConfigError, match="give auth_token or auth_token_env, not both"):
        parse_config({**base, "server": {"auth_token": "a", "auth_token_env": "B"}})
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        instantiate({"_target_": "no_such_module.Scorer"})
    with pytest.raises(ConfigError, match="has no callable 'Nope'"):
        instantiate({"_target_": "unirl.reward.local.Nope"})
    with pytest.raises(ConfigError, match=r"not a unirl\.reward\.RewardBackend"):
        create_app({**base, "rewards": {"x": {"_target_": "collections.OrderedDict"}}})
    with pytest.raises(ConfigError, match="scores generated texts"):
        create_app({**base, "rewards": {"x": {"_target_": "unirl.reward.local.ExactMatch"}}})
    with pytest.raises(ConfigError, match="quality must be in"):
        create_app({**base, "rewards": {"x": {**base["rewards"]["jpeg"], "quality": 0}}})


def test_token_env_must_be_set(monkeypatch):
    config = {
        "server": {"auth_token_env": "UNIRL_TEST_REWARD_TOKEN"},
        "rewards": {"jpeg": {"_target_": "unirl.reward.local.JpegCompressibility"}},
    }
    monkeypatch.delenv("UNIRL_TEST_REWARD_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"UNIRL_TEST_REWARD_TOKEN.*unset or empty"):
        create_app(config)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_console_script_serves_on_loopback(tmp_path):
    path = tmp_path / "service.yaml"
    path.write_text(
        "server: {require_auth: false}\n"
        "rewards:\n  jpeg: {_target_: unirl.reward.local.JpegCompressibility}\n"
    )
    port = _free_port()
    command = [sys.executable, "-m", "unirl_reward_service", "--config", str(path)]
    command += ["--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ)
    )
    try:
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert health is not None, process.stdout.read().decode() if process.stdout else ""
        assert health["status"] == "ok"
        assert list(health["rewards"]) == ["jpeg"]
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=20)
    # uvicorn shuts down cleanly, then re-raises the captured SIGTERM.
    assert process.returncode in (0, -signal.SIGTERM), output.decode()
    assert b"Traceback" not in output, output.decode()
