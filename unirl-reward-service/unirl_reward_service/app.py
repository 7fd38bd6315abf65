"""The FastAPI app: ``GET /health``, ``GET /rewards``, ``POST /score``.

Client mistakes are answered with an :class:`~unirl_reward_service.schemas.ErrorResponse`:
400 unparseable body (not UTF-8) or a query string, 401 missing/wrong bearer token (checked
from the headers, before the body is read), 404 unknown reward, 408 body too slow, 413 body
over ``max_request_bytes`` or more samples / frames / pixels than the limits (pixels are read
from the image and mp4 headers before anything is decoded), 422 malformed body, bad base64
or an undecodable image, or a video whose frames differ in size (the message names the
index), 503 busy or shutting down. Scorer
failures and timeouts are not HTTP errors: they come back as per-sample ``error`` entries
of that reward only.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from torch import Tensor

from unirl_reward_service import __version__
from unirl_reward_service.codec import (
    DecodeError,
    Payload,
    TooLarge,
    decode_payload,
    probe_image,
    probe_mp4,
)
from unirl_reward_service.config import ServiceConfig, parse_config
from unirl_reward_service.middleware import BodyLimit, RequestGuard
from unirl_reward_service.pool import RewardPool, Sample, SampleResult, describe
from unirl_reward_service.schemas import (
    ErrorResponse,
    FieldError,
    HealthResponse,
    Limits,
    PoolState,
    RewardInfo,
    RewardResult,
    RewardsResponse,
    SampleScore,
    ScoreRequest,
    ScoreResponse,
)


@dataclass(frozen=True)
class Probed:
    """A request after :meth:`RewardServer.probe`: per sample its payloads, the edits'
    source images (``None`` without ``sources``) and the pixels decoding will hold."""

    kind: str
    samples: list[list[Payload]]
    sources: list[Payload] | None
    pixels: int


class RewardServer:
    """The app's state: config, one :class:`RewardPool` per reward, the auth token."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.token = config.server.resolve_token()
        self.started = time.monotonic()
        self.inflight = PixelBudget(config.server.max_inflight_pixels)
        self.pools: dict[str, RewardPool] = {}
        try:
            for name, reward in config.rewards.items():
                self.pools[name] = RewardPool(reward, config.server.batch_wait_ms / 1000.0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()

    def info(self) -> RewardsResponse:
        server = self.config.server
        rewards = [
            RewardInfo(
                name=name,
                target=pool.config.target,
                components=list(pool.names),
                has_total=pool.has_total,
                scalar=pool.has_total or len(pool.names) == 1,
                replicas=pool.config.replicas,
                timeout_s=pool.config.timeout_s,
                max_batch_size=pool.config.max_batch_size,
                device=pool.config.device,
                needs_sources=pool.needs_sources,
                scores_videos=pool.scores_videos,
            )
            for name, pool in self.pools.items()
        ]
        limits = Limits(
            max_request_bytes=server.max_request_bytes,
            max_batch_size=server.max_batch_size,
            max_frames=server.max_frames,
            max_image_pixels=server.max_image_pixels,
            max_sample_pixels=server.max_sample_pixels,
            max_request_pixels=server.max_request_pixels,
        )
        return RewardsResponse(rewards=rewards, limits=limits, auth=self.token is not None)

    def health(self, authorized: bool) -> HealthResponse:
        """Status for everyone; the per-reward pools (and so the names) only with the token."""
        states = {name: PoolState(**pool.state()) for name, pool in self.pools.items()}
        degraded = any(s.replicas == 0 or s.abandoned > 0 for s in states.values())
        return HealthResponse(
            status="degraded" if degraded else "ok",
            uptime_s=time.monotonic() - self.started,
            rewards=states if authorized else None,
        )

    def reward_names(self, request: ScoreRequest) -> list[str]:
        if (request.reward is None) == (request.rewards is None):
            raise _error(422, "give exactly one of 'reward' (a name) and 'rewards' (a list)")
        names = [request.reward] if request.reward is not None else list(request.rewards or [])
        if len(set(names)) != len(names):
            raise _error(422, f"'rewards' lists a name twice: {names}")
        unknown = [n for n in names if n not in self.pools]
        if unknown:
            raise _error(
                404,
                f"unknown reward {unknown}; this server has {sorted(self.pools)} (GET /rewards)",
            )
        return names

    def probe(self, request: ScoreRequest) -> Probed:
        """Per sample its payloads (one image, a video's frames, or one mp4) and, for an
        edit, its source image; headers only.

        Every limit is checked here, before any pixel is decoded: samples per request,
        frames per video, and the ``H·W`` / sample / request pixel budgets (413 above each;
        a sample's pixels include its source).
        """
        server = self.config.server
        if (request.images is None) == (request.videos is None):
            raise _error(422, "give exactly one of 'images' and 'videos'")
        kind = "images" if request.images is not None else "videos"
        items: list[Any] = request.images if request.images is not None else request.videos  # type: ignore[assignment]
        n = len(items)
        if n > server.max_batch_size:
            raise _error(
                413,
                f"{n} {kind} in one request; this server accepts at most "
                f"{server.max_batch_size} (server.max_batch_size): split the batch",
            )
        for key, values in (
            ("prompts", request.prompts),
            ("metadata", request.metadata),
            ("sources", request.sources),
        ):
            if values is not None and len(values) != n:
                raise _error(422, f"'{key}' has {len(values)} entries for {n} {kind}")
        if request.sources is not None and kind != "images":
            raise _error(
                422, "'sources' go with 'images' (an edit's result and its source), not 'videos'"
            )
        if kind == "videos" and request.fps is None:
            raise _error(422, "'videos' need 'fps' (the videos' frames per second, e.g. 16.0)")
        if kind == "images" and request.fps is not None:
            raise _error(422, "'fps' goes with 'videos'; drop it for 'images'")
        per_sample: list[list[Payload]] = []
        sources: list[Payload] | None = None if request.sources is None else []
        total = 0
        try:
            for i, item in enumerate(items):
                where = f"{kind}[{i}]"
                if kind == "images":
                    payloads = [probe_image(item, where, server.max_image_pixels)]
                elif isinstance(item, str):
                    payloads = [probe_mp4(item, where, server.max_frames, server.max_image_pixels)]
                else:
                    if len(item) > server.max_frames:
                        raise TooLarge(
                            f"{where}: {len(item)} frames; this server accepts at most "
                            f"{server.max_frames} per video (server.max_frames)"
                        )
                    payloads = [
                        probe_image(frame, f"{where}[{j}]", server.max_image_pixels)
                        for j, frame in enumerate(item)
                    ]
                pixels = sum(p.pixels for p in payloads)
                if sources is not None:
                    source = request.sources[i]  # type: ignore[index]
                    sources.append(probe_image(source, f"sources[{i}]", server.max_image_pixels))
                    pixels += sources[-1].pixels
                if pixels > server.max_sample_pixels:
                    raise TooLarge(
                        f"{where}: decodes to {pixels} pixels; this server accepts at most "
                        f"{server.max_sample_pixels} per sample (server.max_sample_pixels)"
                    )
                total += pixels
                if total > server.max_request_pixels:
                    raise TooLarge(
                        f"{kind}[0..{i}] decode to {total} pixels; this server accepts at most "
                        f"{server.max_request_pixels} per request (server.max_request_pixels): "
                        "send fewer or smaller images per request"
                    )
                per_sample.append(payloads)
        except DecodeError as exc:
            raise _error(422, str(exc)) from exc
        except TooLarge as exc:
            raise _error(413, str(exc)) from exc
        return Probed(kind, per_sample, sources, total)

    def decode(self, request: ScoreRequest, probed: Probed) -> list[Sample]:
        """Decode probed payloads into one sample each: an image ``uint8[3, H, W]`` (an
        edit's carries its decoded source) or a video ``uint8[T, 3, H, W]`` with its fps."""
        n = len(probed.samples)
        prompts = request.prompts if request.prompts is not None else [""] * n
        metadata = request.metadata if request.metadata is not None else [{} for _ in range(n)]
        samples: list[Sample] = []
        try:
            for i, payloads in enumerate(probed.samples):
                frames = [f for p in payloads for f in decode_payload(p)]
                if probed.kind == "videos":
                    video = _stack_frames(frames, f"videos[{i}]")
                    samples.append(Sample(video, prompts[i], metadata[i], fps=request.fps))
                    continue
                source = None
                if probed.sources is not None:
                    source = decode_payload(probed.sources[i])[0]
                samples.append(Sample(frames[0], prompts[i], metadata[i], source))
        except DecodeError as exc:
            raise _error(422, str(exc)) from exc
        except TooLarge as exc:
            raise _error(413, str(exc)) from exc
        return samples

    async def score_one(self, name: str, flat: list[Sample]) -> RewardResult:
        """Run one reward on every sample (image or whole video) of the request."""
        pool = self.pools[name]
        started = time.monotonic()
        timeout_s = pool.config.timeout_s
        try:
            futures = pool.submit(flat)
        except RuntimeError as exc:
            raise _error(503, str(exc)) from exc
        waiters = [asyncio.wrap_future(f) for f in futures]
        for waiter in waiters:
            waiter.add_done_callback(_consume)
        _, pending = await asyncio.wait(waiters, timeout=timeout_s)
        size = pool.config.max_batch_size
        chunk_sizes = [len(flat[i : i + size]) for i in range(0, len(flat), size)]
        if pending:
            timed_out = sum(n for w, n in zip(waiters, chunk_sizes) if w in pending)
            pool.expire(futures, timed_out)
        results: list[SampleResult] = []
        for waiter, n in zip(waiters, chunk_sizes):
            if waiter in pending or waiter.cancelled():
                message = f"timeout after {timeout_s:g}s"
                results += [SampleResult.failed(pool.names, message, pool.has_total)] * n
            elif waiter.exception() is not None:
                message = describe(waiter.exception())  # type: ignore[arg-type]
                results += [SampleResult.failed(pool.names, message, pool.has_total)] * n
            else:
                results += waiter.result()
        return _reward_result(pool, results, time.monotonic() - started)


def create_app(config: ServiceConfig | Mapping[str, Any]) -> FastAPI:
    """Build the app and start every reward's worker pool (stopped on app shutdown)."""
    if not isinstance(config, ServiceConfig):
        config = parse_config(config)
    server = RewardServer(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        server.close()

    app = FastAPI(
        title="UniRL reward service",
        version=__version__,
        summary="Scores images and videos with the rewards named in its YAML config.",
        lifespan=lifespan,
    )
    app.state.reward_server = server
    app.add_middleware(
        BodyLimit,
        max_bytes=config.server.max_request_bytes,
        timeout_s=config.server.body_timeout_s,
        max_json_items=config.server.max_json_items,
        max_json_depth=config.server.max_json_depth,
    )
    app.add_middleware(RequestGuard, token=server.token)  # outermost: runs before BodyLimit
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)

    # RequestGuard has already refused requests without the token (before their body was
    # read); this dependency repeats the check and publishes the scheme in the OpenAPI doc.
    bearer = HTTPBearer(auto_error=False)

    def check_token(
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
    ) -> None:
        if server.token is None:
            return
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), server.token.encode()
        ):
            raise HTTPException(
                401,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    examples = _examples(config, hide_names=server.token is not None)
    secured = [Depends(check_token)] if server.token is not None else []
    auth_responses: dict[int | str, dict[str, Any]] = (
        {401: {"model": ErrorResponse, "description": "Missing or wrong bearer token"}}
        if server.token is not None
        else {}
    )

    @app.get("/health", response_model=HealthResponse, summary="Liveness and per-reward pools")
    async def health(request: Request) -> HealthResponse:
        return server.health(getattr(request.state, "authorized", server.token is None))

    @app.get(
        "/rewards",
        response_model=RewardsResponse,
        dependencies=secured,
        responses=auth_responses,
        summary="Configured rewards, their components and the request limits",
    )
    async def rewards() -> RewardsResponse:
        return server.info()

    @app.post(
        "/score",
        response_model=ScoreResponse,
        dependencies=secured,
        responses={
            **auth_responses,
            400: {
                "model": ErrorResponse,
                "description": "Body is not parseable (e.g. not UTF-8), or a query string",
            },
            404: {"model": ErrorResponse, "description": "Unknown reward name"},
            408: {"model": ErrorResponse, "description": "Body not received in body_timeout_s"},
            413: {
                "model": ErrorResponse,
                "description": "Body over max_request_bytes, or more samples, frames or "
                "decoded pixels (read from the headers) than the server's limits",
            },
            422: {
                "model": ErrorResponse,
                "description": "Malformed body, bad base64 or an undecodable image",
            },
            503: {
                "model": ErrorResponse,
                "description": "Busy (pixels in flight, connections) or shutting down",
            },
        },
        summary="Score images or videos with one or several rewards",
    )
    async def score(
        request: ScoreRequest = Body(openapi_examples=examples),  # noqa: B008 (FastAPI idiom)
    ) -> ScoreResponse:
        names = server.reward_names(request)
        probed = await run_in_threadpool(server.probe, request)
        wait_s = max(server.pools[n].config.timeout_s for n in names)
        async with server.inflight.hold(probed.pixels, wait_s):
            per_sample = await run_in_threadpool(server.decode, request, probed)
            kind = probed.kind
            del probed  # the encoded bytes are no longer needed
            results = await asyncio.gather(*(server.score_one(n, per_sample) for n in names))
        return ScoreResponse(
            kind=kind,  # type: ignore[arg-type]
            num_samples=len(per_sample),
            results=dict(zip(names, results)),
        )

    return app


# A 2x2 red PNG, so the published examples are requests that really score.
_EXAMPLE_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8ISfHwMDAxMDAwMDAAAANBAEIfXHKZgAAAABJRU5ErkJggg=="


def _examples(config: ServiceConfig, hide_names: bool) -> dict[str, Any]:
    """Published request examples; with auth on they name no reward (the OpenAPI document
    is served without a token), so ``<reward>`` stands for a name from ``GET /rewards``."""
    names = ["<reward>"] if hide_names else list(config.rewards)
    return {
        "images": {
            "summary": "Two PNG images, one reward",
            "value": {
                "reward": names[0],
                "images": [_EXAMPLE_PNG, _EXAMPLE_PNG],
                "prompts": ['a sign that says "hi"', 'a sign that says "hi"'],
                "metadata": [{}, {}],
            },
        },
        "edit": {
            "summary": "One edit: the result and the image it was edited from",
            "value": {
                "reward": names[0],
                "images": [_EXAMPLE_PNG],
                "sources": [_EXAMPLE_PNG],
                "prompts": ["make it blue"],
            },
        },
        "videos": {
            "summary": "One two-frame video, every reward",
            "value": {"rewards": names, "videos": [[_EXAMPLE_PNG, _EXAMPLE_PNG]], "fps": 16.0},
        },
    }


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> HTTPException:
    return HTTPException(status_code=status, detail=detail, headers=headers)


class PixelBudget:
    """Decoded pixels held by the requests in flight, at most ``capacity`` together.

    A request reserves its header-declared pixels before decoding and releases them when
    its answer is ready; one that does not fit waits (503 with ``Retry-After`` after
    ``timeout_s``). Server-wide bound on decoded images: ``3 · capacity`` bytes.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def hold(self, pixels: int, timeout_s: float) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a condition binds to the loop it first waits on
            self._loop, self._changed = loop, asyncio.Condition()
        changed = self._changed
        async with changed:
            try:
                await asyncio.wait_for(
                    changed.wait_for(lambda: self.held + pixels <= self.capacity), timeout_s
                )
            except TimeoutError:
                raise _error(
                    503,
                    f"server busy: {self.held} decoded pixels in flight and this request needs "
                    f"{pixels} (server.max_inflight_pixels={self.capacity}); retry",
                    {"Retry-After": "1"},
                ) from None
            self.held += pixels
        try:
            yield
        finally:
            async with changed:
                self.held -= pixels
                changed.notify_all()


def _consume(future: asyncio.Future) -> None:
    """Retrieve a late exception so asyncio does not log 'never retrieved'."""
    if not future.cancelled():
        future.exception()


def _stack_frames(frames: list[Tensor], where: str) -> Tensor:
    """A video's decoded frames as ``uint8[T, 3, H, W]``; frames of different sizes are a
    :class:`DecodeError` naming the video and the first frame that differs."""
    first = tuple(frames[0].shape)
    for j, frame in enumerate(frames):
        if tuple(frame.shape) != first:
            raise DecodeError(
                f"{where}: frame {j} is {frame.shape[2]}x{frame.shape[1]} but frame 0 is "
                f"{first[2]}x{first[1]}; every frame of a video needs the same size"
            )
    return torch.stack(frames)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _reward_result(pool: RewardPool, results: list[SampleResult], elapsed: float) -> RewardResult:
    names = pool.names
    samples: list[SampleScore] = []
    failures = 0
    per_component = dict.fromkeys(names, 0)
    timeouts = 0
    for r in results:
        if pool.has_total:
            raw = r.total
        elif len(names) == 1:
            raw = r.components[names[0]]
        else:
            raw = None
        score = _finite(raw)
        error = None
        if r.errors:
            first = next(iter(r.errors))
            error = r.errors[first] if len(names) == 1 else f"{first}: {r.errors[first]}"
        if raw is not None and score is None and error is None:
            error = f"non-finite total ({raw})"
        components = {n: _finite(r.components[n]) for n in names}
        failed = (score is None and raw is not None) or any(v is None for v in components.values())
        failures += failed
        timeouts += any(e.startswith("timeout after") for e in r.errors.values())
        for n in names:
            per_component[n] += components[n] is None
        samples.append(
            SampleScore(
                score=score, error=error, components=components, component_errors=dict(r.errors)
            )
        )
    metrics = {"failures": float(failures), "timeouts": float(timeouts)}
    metrics.update({f"{n}/failures": float(c) for n, c in per_component.items()})
    return RewardResult(
        components=list(names),
        has_total=pool.has_total,
        samples=samples,
        metrics=metrics,
        elapsed_s=elapsed,
    )


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        FieldError(
            loc=[p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
            msg=str(e.get("msg", "")),
            type=str(e.get("type", "")),
        )
        for e in exc.errors()
    ]
    first = errors[0] if errors else None
    detail = "invalid request body"
    if first is not None:
        detail += f": {'.'.join(str(p) for p in first.loc)}: {first.msg}"
    body = ErrorResponse(detail=detail, errors=errors)
    return JSONResponse(status_code=422, content=body.model_dump())


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    body = ErrorResponse(detail=str(exc.detail))
    return JSONResponse(status_code=exc.status_code, content=body.model_dump(), headers=exc.headers)
