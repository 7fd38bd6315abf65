"""The service's YAML config: a ``server`` block and a ``rewards`` block, as typed dataclasses.

```yaml
server: {host: 127.0.0.1, port: 8700, auth_token_env: UNIRL_REWARD_TOKEN}
rewards:
  ocr: {_target_: unirl.reward.local.OCRScorer, replicas: 2, timeout_s: 30}
  jpeg: {_target_: unirl.reward.local.JpegCompressibility}
```

Each reward entry is the scorer's ``_target_`` block plus the pool keys in
:data:`POOL_KEYS`, which are taken out before the scorer is built.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from unirl.config import ConfigError, require
from unirl.reward import RewardBackend, TextRewardBackend

POOL_KEYS = ("replicas", "timeout_s", "max_batch_size", "device")
"""Keys of a reward entry that configure its worker pool, not the scorer."""

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(kw_only=True)
class ServerConfig:
    """HTTP-level settings and limits shared by every reward.

    Request limits (413 above each): ``max_request_bytes`` of body; ``max_batch_size``
    samples (images or videos) per request; ``max_frames`` frames per video. Decoded-pixel
    budgets, checked from the image and mp4 headers before any pixel is decoded (413 above
    each): ``max_image_pixels`` ``H·W`` of one image or frame, ``max_sample_pixels`` of one
    sample (a video's frames together), ``max_request_pixels`` of one request. Requests in
    flight hold at most ``max_inflight_pixels`` decoded pixels together; a request that
    would go over waits its turn (503 when a reward's ``timeout_s`` passes first). A pixel is
    held as 3 bytes (``uint8`` RGB) plus 12 (``float32``) while a scorer runs on it, so the
    default in-flight budget bounds decoded images to 0.4 GB, 2 GB while all are scored.

    JSON shape (413 before parsing): at most ``max_json_items`` objects and arrays in a body
    and ``max_json_depth`` levels of nesting, counted on the raw bytes, so a body of millions
    of empty objects is refused before it becomes millions of dicts.
    Connections: at most ``max_connections`` open at once (a new one over the limit closes
    the longest-idle connection without a request in progress, or is answered 503 when none
    has been idle for ``min(1 s, header_timeout_s / 10)``); a connection must deliver a
    request's headers within ``header_timeout_s`` of opening (or of its previous answer),
    its body within ``body_timeout_s`` (408 after); an idle keep-alive connection closes
    after ``keep_alive_s``.

    The bearer token is ``auth_token`` or the value of env var ``auth_token_env`` (not both).
    Without either the service refuses to start unless ``require_auth`` is false.
    ``batch_wait_ms`` is how long a free replica waits for more requests to fill a batch.
    """

    host: str = "127.0.0.1"
    port: int = 8700
    max_request_bytes: int = 64 * 1024 * 1024
    max_batch_size: int = 256
    max_frames: int = 64
    max_image_pixels: int = 4096 * 4096
    max_sample_pixels: int = 2**26
    max_request_pixels: int = 2**26
    max_inflight_pixels: int = 2**27
    max_connections: int = 64
    max_json_items: int = 65536
    max_json_depth: int = 32
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    batch_wait_ms: float = 5.0
    auth_token: str | None = None
    auth_token_env: str | None = None
    require_auth: bool = True

    def __post_init__(self) -> None:
        require(bool(self.host), "server.host must be a non-empty address (e.g. 127.0.0.1)")
        require(0 <= int(self.port) <= 65535, f"server.port={self.port} must be in [0, 65535]")
        require(self.max_request_bytes > 0, "server.max_request_bytes must be > 0")
        require(self.max_batch_size >= 1, "server.max_batch_size must be >= 1")
        require(self.max_frames >= 1, "server.max_frames must be >= 1")
        for name in ("max_image_pixels", "max_sample_pixels", "max_request_pixels"):
            require(getattr(self, name) >= 1, f"server.{name} must be >= 1")
        require(
            self.max_inflight_pixels >= self.max_request_pixels,
            f"server.max_inflight_pixels={self.max_inflight_pixels} must be >= "
            f"server.max_request_pixels={self.max_request_pixels} (or no request could run)",
        )
        require(self.max_connections >= 1, "server.max_connections must be >= 1")
        require(self.max_json_items >= 64, "server.max_json_items must be >= 64")
        require(self.max_json_depth >= 4, "server.max_json_depth must be >= 4")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            require(getattr(self, name) > 0, f"server.{name} must be > 0")
        require(self.batch_wait_ms >= 0.0, "server.batch_wait_ms must be >= 0")
        require(
            not (self.auth_token and self.auth_token_env),
            "server: give auth_token or auth_token_env, not both",
        )
        has_token = bool(self.auth_token or self.auth_token_env)
        require(
            has_token or not self.require_auth,
            "server.auth_token and server.auth_token_env are both empty: set "
            "server.auth_token_env: UNIRL_REWARD_TOKEN (and export a token in it), or set "
            "server.require_auth: false to serve without auth",
        )
        require(
            not (has_token and not self.require_auth),
            "server.require_auth is false but a token is configured: remove "
            "server.auth_token / server.auth_token_env, or drop require_auth: false",
        )

    def resolve_token(self) -> str | None:
        """The bearer token clients must send, or ``None`` when auth is off."""
        if self.auth_token_env:
            token = os.environ.get(self.auth_token_env)
            require(
                bool(token),
                f"server.auth_token_env={self.auth_token_env!r} but that environment variable "
                "is unset or empty; export it or remove auth_token_env",
            )
            return token
        return self.auth_token or None


@dataclass(kw_only=True)
class RewardConfig:
    """One named reward: the scorer's ``_target_`` block and its pool settings.

    ``replicas`` worker threads each own a scorer instance; ``max_batch_size`` is the most
    images one scorer call gets; ``timeout_s`` bounds how long a request waits for this
    reward (queueing included) before its samples get ``"timeout after Xs"`` errors.
    """

    name: str
    scorer: dict[str, Any]
    replicas: int = 1
    timeout_s: float = 60.0
    max_batch_size: int = 32
    device: str = "cpu"

    def __post_init__(self) -> None:
        require(
            bool(_NAME.match(self.name)),
            f"rewards: name {self.name!r} may only use letters, digits, '_', '.' and '-'",
        )
        require(
            isinstance(self.scorer, Mapping) and "_target_" in self.scorer,
            f"rewards.{self.name}: give the scorer as a block with _target_ "
            "(e.g. _target_: unirl.reward.local.JpegCompressibility)",
        )
        require(self.replicas >= 1, f"rewards.{self.name}.replicas must be >= 1")
        require(self.timeout_s > 0, f"rewards.{self.name}.timeout_s must be > 0")
        require(self.max_batch_size >= 1, f"rewards.{self.name}.max_batch_size must be >= 1")

    @property
    def target(self) -> str:
        return str(self.scorer["_target_"])

    def build(self) -> RewardBackend:
        """A fresh scorer instance on ``device`` (each replica calls this once)."""
        scorer = instantiate(self.scorer)
        if not isinstance(scorer, RewardBackend):
            raise ConfigError(
                f"rewards.{self.name}: {self.target} built a {type(scorer).__name__}, "
                "not a unirl.reward.RewardBackend"
            )
        if isinstance(scorer, TextRewardBackend):
            raise ConfigError(
                f"rewards.{self.name}: {self.target} scores generated texts; this service "
                "scores images and videos (run text rewards in the trainer)"
            )
        return scorer.to(self.device)


@dataclass(kw_only=True)
class ServiceConfig:
    """The whole file: ``server`` limits and the named ``rewards``."""

    server: ServerConfig = field(default_factory=ServerConfig)
    rewards: dict[str, RewardConfig]

    def __post_init__(self) -> None:
        require(len(self.rewards) > 0, "rewards: configure at least one reward")


def parse_config(raw: Mapping[str, Any]) -> ServiceConfig:
    """Build a :class:`ServiceConfig` from the YAML mapping; unknown keys raise."""
    require(isinstance(raw, Mapping), "the service config must be a mapping with 'rewards'")
    unknown = sorted(set(raw) - {"server", "rewards"})
    require(not unknown, f"service config: unknown top-level keys {unknown}; use server, rewards")
    server_raw = dict(raw.get("server") or {})
    allowed = {f.name for f in fields(ServerConfig)}
    bad = sorted(set(server_raw) - allowed)
    require(not bad, f"server: unknown keys {bad}; allowed are {sorted(allowed)}")
    rewards_raw = raw.get("rewards")
    require(
        isinstance(rewards_raw, Mapping) and rewards_raw,
        "rewards: give a mapping of name -> {_target_: ..., replicas: ..., timeout_s: ...}",
    )
    rewards: dict[str, RewardConfig] = {}
    for name, entry in rewards_raw.items():
        require(isinstance(entry, Mapping), f"rewards.{name} must be a mapping with _target_")
        scorer = {k: v for k, v in entry.items() if k not in POOL_KEYS}
        pool = {k: entry[k] for k in POOL_KEYS if k in entry}
        rewards[str(name)] = RewardConfig(name=str(name), scorer=scorer, **pool)
    return ServiceConfig(server=ServerConfig(**server_raw), rewards=rewards)


def load_config(path: str | os.PathLike[str]) -> ServiceConfig:
    """Read and validate a YAML service config."""
    import yaml

    path = Path(path)
    require(path.is_file(), f"service config {str(path)!r} does not exist")
    with path.open() as handle:
        raw = yaml.safe_load(handle)
    return parse_config(raw or {})


def instantiate(spec: Any) -> Any:
    """Build ``spec``: a mapping with ``_target_`` is called with its other keys (built first).

    Nested mappings and lists are built recursively, so a ``WeightedRewardBackend`` with
    ``components: {a: {_target_: ...}}`` works. Plain values pass through.
    """
    if isinstance(spec, Mapping):
        built = {str(k): instantiate(v) for k, v in spec.items() if k != "_target_"}
        if "_target_" not in spec:
            return built
        return _locate(str(spec["_target_"]))(**built)
    if isinstance(spec, list | tuple):
        return [instantiate(v) for v in spec]
    return spec


def _locate(target: str) -> Any:
    module_name, _, attr = target.rpartition(".")
    require(bool(module_name), f"_target_ {target!r} must be a dotted path 'module.Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"_target_ {target!r}: cannot import {module_name!r} ({exc})") from exc
    obj = getattr(module, attr, None)
    require(callable(obj), f"_target_ {target!r}: {module_name!r} has no callable {attr!r}")
    return obj
