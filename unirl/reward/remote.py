"""RemoteRewardBackend: the HTTP client of the standalone ``unirl-reward-service``."""

from __future__ import annotations

import base64
import functools
import io
import json
import math
import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np
from PIL import Image
from torch import Tensor

from unirl.config import ConfigError, require
from unirl.reward.base import (
    RewardBackend,
    RewardError,
    ScoreResult,
    as_scores,
    check_images,
    check_lengths,
    check_videos,
    images_to_uint8,
)

if TYPE_CHECKING:
    import httpx


class RewardInfo(TypedDict, total=False):
    """One reward of the service's ``GET /rewards`` answer, as the client reads it."""

    name: str
    components: list[str]
    scalar: bool
    has_total: bool
    timeout_s: float
    scores_videos: bool


class _SampleResult(TypedDict, total=False):
    """One sample of a ``POST /score`` answer: the scalar ``score`` or per-component values,
    with the error of the sample or of each component (absent or null: scored)."""

    score: float | None
    error: str | None
    components: dict[str, float | None]
    component_errors: dict[str, str | None]


_RETRY_STATUS = (429, 500, 502, 503, 504)


def _httpx() -> ModuleType:
    try:
        import httpx
    except ImportError as exc:
        raise ImportError(
            "RemoteRewardBackend needs httpx: pip install 'httpx>=0.27' (included in unirl-mm[dev])"
        ) from exc
    return httpx


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process (building one costs ~0.1-0.4 s per client)."""
    return _httpx().create_ssl_context()


@dataclass(kw_only=True)
class RemoteRewardBackend(RewardBackend):
    """Scores images with reward ``reward`` of a ``unirl-reward-service`` at ``url``.

    ``components`` names the server components to return (``names``); empty means the
    reward's scalar ``score`` under the name ``reward``. ``use_total=True`` also returns the
    server's total (for a combining reward, e.g. a ``WeightedRewardBackend``), so several
    components can feed ``RewardService`` directly. Images go as base64 PNG (lossless for
    ``uint8``) or JPEG, ``batch_size`` per request (capped at the server's
    ``max_batch_size``, and so that a request's ``N·H·W`` stays within its
    ``max_request_pixels``). Timeouts, connection errors, 429 and 5xx
    are retried ``max_retries`` times with backoff ``backoff_s · 2^k`` (capped at
    ``max_backoff_s``; a numeric ``Retry-After`` wins); other 4xx raise at once with the
    server's message. A per-sample server error becomes NaN plus ``errors[name][i]``, so the
    service's failure policy applies. The server is checked on first use (or :meth:`check`).
    Edits (:meth:`score_edit`) send each result's source image in the same request
    (``sources``, same encoding; the per-request pixel budget counts both); an edit reward on
    the server answers a request without sources with per-sample errors. Videos
    (:meth:`score_video`) go as their frames (``videos``: per sample a list of images in the
    same encoding) with ``fps``; the budget counts every frame, and the server hands the
    reward ``frames[n, T, 3, H, W]`` (its ``score_video``).

    ``timeout_s``: httpx's timeout in seconds for each request (connect, read and write each;
    it must exceed the server's own ``timeout_s`` for the reward); ``backoff_s``: the first
    retry's wait (doubling per retry). ``token``: the service's bearer token, or
    ``token_env``: the environment variable holding it (read at each request; one of the two,
    or neither for an open service). A ``scheme://user:password@host`` URL sends HTTP basic
    auth with those credentials instead (not together with a token: one ``Authorization``
    header); the credentials are taken out of ``url`` at construction, so no message, log
    line or ``repr`` carries them (nor the token). ``image_format``: ``png`` or ``jpeg``, at
    ``jpeg_quality`` (1-100).
    """

    url: str
    reward: str
    components: Sequence[str] = ()
    use_total: bool = False
    timeout_s: float = 120.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    batch_size: int = 32
    token: str | None = field(default=None, repr=False)
    token_env: str | None = None
    image_format: Literal["png", "jpeg"] = "png"
    jpeg_quality: int = 95

    _client: Any = field(init=False, repr=False, compare=False, default=None)
    _info: dict[str, Any] | None = field(init=False, repr=False, compare=False, default=None)
    _request_size: int = field(init=False, repr=False, compare=False, default=0)
    _request_pixels: int = field(init=False, repr=False, compare=False, default=0)
    _max_frames: int = field(init=False, repr=False, compare=False, default=0)
    _basic_auth: tuple[str, str] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        self.url = str(self.url).rstrip("/")
        self.components = tuple(str(c) for c in self.components)
        self.url, self._basic_auth = _split_credentials(self.url)
        require(
            self.url.startswith(("http://", "https://")),
            f"RemoteRewardBackend.url={self.url!r} must start with http:// or https://",
        )
        require(
            self._basic_auth is None or not (self.token or self.token_env),
            "RemoteRewardBackend: the url carries user:password (basic auth) and a token is "
            "set too; one Authorization header goes per request: keep one of the two",
        )
        require(bool(self.reward), "RemoteRewardBackend.reward must name a reward on the server")
        require(
            len(set(self.components)) == len(self.components),
            f"RemoteRewardBackend.components {list(self.components)} lists a name twice",
        )
        require(self.timeout_s > 0, "RemoteRewardBackend.timeout_s must be > 0")
        require(self.max_retries >= 0, "RemoteRewardBackend.max_retries must be >= 0")
        require(self.backoff_s >= 0, "RemoteRewardBackend.backoff_s must be >= 0")
        require(self.max_backoff_s >= 0, "RemoteRewardBackend.max_backoff_s must be >= 0")
        require(self.batch_size >= 1, "RemoteRewardBackend.batch_size must be >= 1")
        require(
            self.image_format in ("png", "jpeg"),
            f"RemoteRewardBackend.image_format={self.image_format!r}: use 'png' or 'jpeg'",
        )
        require(1 <= self.jpeg_quality <= 100, "RemoteRewardBackend.jpeg_quality in [1, 100]")
        require(
            not (self.token and self.token_env),
            "RemoteRewardBackend: give token or token_env, not both",
        )
        # A combining remote reward fills ScoreResult.total, like WeightedRewardBackend.
        self.produces_total = self.use_total  # type: ignore[misc]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.components) if self.components else (self.reward,)

    # -- setup -----------------------------------------------------------------------------

    def check(self) -> RewardInfo:
        """``GET /rewards`` and verify the reward, components and limits; returns its info."""
        body = self._request("GET", "/rewards", None)
        rewards = {r["name"]: r for r in body.get("rewards", [])}
        info = rewards.get(self.reward)
        if info is None:
            raise RewardError(
                f"reward service {self.url} has no reward '{self.reward}'; "
                f"it serves {sorted(rewards)}"
            )
        have = list(info.get("components", []))
        missing = [c for c in self.components if c not in have]
        if missing:
            raise RewardError(
                f"reward '{self.reward}' on {self.url} lacks components {missing}; it has {have}"
            )
        if not self.components and not info.get("scalar", False):
            raise RewardError(
                f"reward '{self.reward}' on {self.url} has components {have} and no total; "
                "set RemoteRewardBackend.components to the ones you need"
            )
        if self.use_total and not info.get("has_total", False):
            raise RewardError(
                f"RemoteRewardBackend.use_total=true but reward '{self.reward}' on {self.url} "
                "has no total (it is not a combining backend)"
            )
        # Requests never carry more samples or pixels than the server accepts (it would
        # answer 413); a server without a pixel budget (older versions) gives 0 here.
        limits = body.get("limits", {})
        limit = int(limits.get("max_batch_size", self.batch_size))
        self._request_size = max(1, min(self.batch_size, limit))
        self._request_pixels = int(limits.get("max_request_pixels", 0))
        self._max_frames = int(limits.get("max_frames", 0))
        server_timeout = float(info.get("timeout_s", 0.0))
        if server_timeout >= self.timeout_s:
            raise ConfigError(
                f"RemoteRewardBackend.timeout_s={self.timeout_s} is not above the server's "
                f"timeout_s={server_timeout} for '{self.reward}'; the client would give up "
                "before the server answers: raise timeout_s"
            )
        self._info = info
        return info

    def close(self) -> None:
        """Close the HTTP connection pool (a later call opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_client"] = None  # connections do not travel (e.g. to a Ray worker)
        return state

    # -- scoring ---------------------------------------------------------------------------

    def score(self, images: Tensor | None, prompts: list[str], metadata: list[dict]) -> ScoreResult:
        """Score ``images[N, 3, H, W]`` in [0, 1]; returns one ``Tensor[N]`` per name."""
        source = f"RemoteRewardBackend('{self.reward}' at {self.url})"
        images = check_images(images, len(prompts), source)
        return self._score(images, None, prompts, metadata)

    def score_edit(
        self, images: Tensor, sources: Tensor, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        """Score ``N`` edits: ``images[N, 3, H, W]`` results and ``sources[N, 3, H', W']``
        in [0, 1] go in the same requests (``sources``, encoded like the images); the server
        passes them to rewards that compare the two and scores the result alone otherwise."""
        n = len(prompts)
        source = f"RemoteRewardBackend('{self.reward}' at {self.url})"
        images = check_images(images, n, source)
        sources = check_images(sources, n, f"{source} (sources)")
        return self._score(images, sources, prompts, metadata)

    def score_video(
        self, frames: Tensor, fps: float, prompts: list[str], metadata: list[dict]
    ) -> ScoreResult:
        """Score ``N`` videos ``frames[N, T, 3, H, W]`` in [0, 1] at ``fps``: each goes as its
        ``T`` frames (``videos``, encoded like images) and the server's reward scores the
        whole video. A reward the server reports as image-only is refused before posting."""
        n = len(prompts)
        source = f"RemoteRewardBackend('{self.reward}' at {self.url})"
        frames = check_videos(frames, n, source)
        if not (isinstance(fps, int | float) and math.isfinite(fps) and fps > 0):
            raise RewardError(f"{source}: fps={fps!r}; give the videos' frames per second > 0")
        return self._score(frames, None, prompts, metadata, fps=float(fps))

    def _score(
        self,
        images: Tensor,
        sources: Tensor | None,
        prompts: list[str],
        metadata: list[dict],
        fps: float | None = None,
    ) -> ScoreResult:
        """Post ``images[N, 3, H, W]`` (or, with ``fps``, videos ``[N, T, 3, H, W]``) in
        requests within the server's limits; collect per-sample scores and errors."""
        n = len(prompts)
        source = f"RemoteRewardBackend('{self.reward}' at {self.url})"
        check_lengths(n, source, metadata=metadata)
        for i, meta in enumerate(metadata):
            try:
                json.dumps(meta)
            except (TypeError, ValueError) as exc:
                raise RewardError(
                    f"{source}: metadata[{i}] is not JSON-serialisable: {exc}"
                ) from exc
        if self._info is None:
            self.check()
        if sources is not None and "needs_sources" not in (self._info or {}):
            raise RewardError(
                f"{source}: the service predates edit requests (GET /rewards has no "
                "'needs_sources'); upgrade unirl-reward-service on the server to score edits"
            )
        if fps is not None:
            self._check_video_support(images.shape[1], source)
            # [N, T, 3, H, W] -> per sample its T frames as uint8[H, W, 3]
            pixels = images_to_uint8(images.flatten(0, 1))
            pixels = pixels.reshape(n, images.shape[1], *pixels.shape[1:])
        else:
            pixels = images_to_uint8(images)
        source_pixels = images_to_uint8(sources) if sources is not None else None
        per_request = self._request_size
        if self._request_pixels:
            height, width = images.shape[-2:]
            per_sample = height * width * (images.shape[1] if fps is not None else 1)
            if sources is not None:
                per_sample += sources.shape[-2] * sources.shape[-1]
            per_request = max(1, min(per_request, self._request_pixels // per_sample))
        values: dict[str, list[float]] = {name: [] for name in self.names}
        errors: dict[str, list[str | None]] = {name: [] for name in self.names}
        totals: list[float] = []
        retries = 0
        for start in range(0, n, per_request):
            stop = min(start + per_request, n)
            payload: dict[str, object] = {"reward": self.reward}
            if fps is not None:
                payload["videos"] = [[self._encode(f) for f in v] for v in pixels[start:stop]]
                payload["fps"] = fps
            else:
                payload["images"] = [self._encode(p) for p in pixels[start:stop]]
            payload["prompts"] = list(prompts[start:stop])
            payload["metadata"] = list(metadata[start:stop])
            if source_pixels is not None:  # absent for plain images: the original wire format
                payload["sources"] = [self._encode(p) for p in source_pixels[start:stop]]
            body, attempts = self._request_counted("POST", "/score", payload)
            retries += attempts - 1
            samples = body.get("results", {}).get(self.reward, {}).get("samples")
            if not isinstance(samples, list) or len(samples) != stop - start:
                got = len(samples) if isinstance(samples, list) else None
                raise RewardError(
                    f"{source}: expected {stop - start} results for samples {start}..{stop - 1}, "
                    f"got {got}"
                )
            for sample in samples:
                self._collect(sample, values, errors)
                if self.use_total:
                    totals.append(_num(sample.get("score")))
        failed = sum(
            any(not math.isfinite(values[name][i]) for name in self.names) for i in range(n)
        )
        return ScoreResult(
            scores={name: as_scores(v) for name, v in values.items()},
            errors=errors,
            total=as_scores(totals) if self.use_total else None,
            metrics={
                f"remote/{self.reward}/retries": float(retries),
                f"remote/{self.reward}/failed_samples": float(failed),
            },
        )

    def _check_video_support(self, num_frames: int, source: str) -> None:
        """Refuse, before posting, a server that predates whole-video scoring, an image-only
        reward, and videos longer than the server's ``max_frames``."""
        info = self._info or {}
        if "scores_videos" not in info:
            raise RewardError(
                f"{source}: the service predates whole-video requests (GET /rewards has no "
                "'scores_videos'; it would average an image reward over frames); upgrade "
                "unirl-reward-service on the server to score videos"
            )
        if not info["scores_videos"]:
            raise RewardError(
                f"{source}: reward '{self.reward}' on the server scores images, not videos; "
                "configure it there wrapped as {_target_: unirl.reward.local.PerFrame, "
                "aggregate: mean, scorer: {...}}, or use a video reward"
            )
        if self._max_frames and num_frames > self._max_frames:
            raise RewardError(
                f"{source}: videos of {num_frames} frames; the server accepts at most "
                f"{self._max_frames} per video (server.max_frames): send fewer frames"
            )

    def _collect(
        self,
        sample: _SampleResult,
        values: dict[str, list[float]],
        errors: dict[str, list[str | None]],
    ) -> None:
        component_errors = sample.get("component_errors") or {}
        if not self.components:
            value = _num(sample.get("score"))
            values[self.reward].append(value)
            error = sample.get("error")
            if error is None and not math.isfinite(value):
                error = "the server returned no score"
            errors[self.reward].append(error)
            return
        found = sample.get("components") or {}
        for name in self.components:
            value = _num(found.get(name))
            error = component_errors.get(name)
            if error is None and not math.isfinite(value):
                error = sample.get("error") or f"the server returned no score for '{name}'"
            values[name].append(value)
            errors[name].append(error)

    def _encode(self, pixels: np.ndarray) -> str:
        buffer = io.BytesIO()
        if self.image_format == "png":
            Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        else:
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=self.jpeg_quality)
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    # -- HTTP ------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        token = self.token
        if self.token_env:
            token = os.environ.get(self.token_env)
            require(
                bool(token),
                f"RemoteRewardBackend.token_env={self.token_env!r} is unset or empty; "
                "export the service's bearer token in it",
            )
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _request(self, method: str, path: str, payload: dict | None) -> dict[str, Any]:
        return self._request_counted(method, path, payload)[0]

    def _request_counted(
        self, method: str, path: str, payload: dict | None
    ) -> tuple[dict[str, Any], int]:
        """Send with retries; returns ``(json body, attempts)``."""
        httpx = _httpx()
        if self._client is None:
            self._client = httpx.Client(
                timeout=self.timeout_s, verify=_tls_context(), auth=self._basic_auth
            )
        headers = self._headers()
        where = f"reward service {method} {self.url}{path} (reward '{self.reward}')"
        last = ""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            wait = min(self.backoff_s * 2**attempt, self.max_backoff_s)
            try:
                response = self._client.request(
                    method, self.url + path, json=payload, headers=headers
                )
            except httpx.TransportError as exc:  # timeouts and connection errors
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    try:
                        return response.json(), attempt + 1
                    except ValueError as exc:
                        raise RewardError(f"{where}: answer is not JSON ({exc})") from exc
                detail = _detail(response)
                if response.status_code not in _RETRY_STATUS:
                    raise RewardError(f"{where} answered {response.status_code}: {detail}")
                last = f"HTTP {response.status_code}: {detail}"
                retry_after = _retry_after(response)
                if retry_after is not None:
                    wait = min(retry_after, self.max_backoff_s)
            if attempt + 1 < attempts:
                time.sleep(wait)
        raise RewardError(f"{where} failed after {attempts} attempts; last error: {last}")


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``scheme://user:password@host/...`` -> (``scheme://host/...``, (user, password));
    a URL without credentials comes back unchanged with ``None``."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to the exponential backoff
