"""ASGI middleware that runs before any body is read: the request guard (query strings,
bearer token) and the body limit (size and time).

Order, outermost first: :class:`RequestGuard` -> :class:`BodyLimit` -> the FastAPI app. A
request without the right token is answered 401 from its headers alone, so an
unauthenticated client never gets a byte of its body read, parsed or decoded.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from unirl_reward_service.schemas import ErrorResponse

PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Answered without a token: liveness, and the API description (which, with auth on, holds
no reward names; ``/health`` lists the rewards only to a request with the token)."""


def token_matches(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    """Whether ``Authorization: Bearer <token>`` is among ``headers`` (constant-time compare)."""
    for key, value in headers:
        if key == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            if scheme.lower() == b"bearer":
                return hmac.compare_digest(credentials.strip(), token.encode())
    return False


class RequestGuard:
    """400 for any query string; 401 without the bearer token (except :data:`PUBLIC_PATHS`).

    The service takes no query parameters, and a token put in a URL ends up in access logs
    and proxies, so every query string is refused (and redacted from the access log, see
    :mod:`unirl_reward_service.connections`). Public paths run with
    ``scope["state"]["authorized"]`` telling the handler whether the token was sent.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("query_string"):
            await send_error(
                send,
                400,
                "this service takes no query parameters; send the token as the header "
                "'Authorization: Bearer <token>', never in the URL",
            )
            return
        authorized = self.token is None or token_matches(scope["headers"], self.token)
        scope.setdefault("state", {})["authorized"] = authorized
        if not authorized and scope["path"] not in PUBLIC_PATHS:
            await send_error(
                send,
                401,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: 413 when ``Content-Length`` or the received body exceeds ``max_bytes``;
    408 when the body has not fully arrived ``timeout_s`` after the headers.

    The body is read here (at most ``max_bytes``) and replayed to the app.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        timeout_s: float,
        max_json_items: int = 65536,
        max_json_depth: int = 32,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_json_items = max_json_items
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await send_error(send, 400, "Content-Length is not an integer")
                    return
                if declared > self.max_bytes:
                    await send_error(send, 413, self._too_large(declared))
                    return
        body = bytearray()
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    if len(body) > self.max_bytes:
                        await send_error(send, 413, self._too_large(len(body)))
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await send_error(
                send,
                408,
                f"the request body did not arrive within server.body_timeout_s={self.timeout_s:g} "
                f"(got {len(body)} bytes)",
            )
            return
        shape = json_shape_problem(body, self.max_json_items, self.max_json_depth)
        if shape is not None:
            await send_error(send, 413, shape)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self, size: int) -> str:
        return (
            f"request body of {size} bytes exceeds server.max_request_bytes={self.max_bytes}; "
            "send fewer or smaller images per request"
        )


_CONTAINER_BYTES = re.compile(rb"[\[\]{}]")


def json_shape_problem(body: bytes | bytearray, max_items: int, max_depth: int) -> str | None:
    """Why ``body`` would be too costly to parse, from its raw bytes, or ``None``: more than
    ``max_items`` objects and arrays (``{`` and ``[`` counted, C speed, before any parsing), or
    nesting deeper than ``max_depth``. Brackets inside strings count too (base64 has none), so
    the count is an upper bound: a body is never let through on an undercount."""
    items = body.count(b"{") + body.count(b"[")
    if items > max_items:
        return (
            f"request body holds {items} JSON objects / arrays, over server.max_json_items="
            f"{max_items}; send fewer samples per request (metadata objects count too)"
        )
    depth = deepest = 0
    for match in _CONTAINER_BYTES.finditer(body):  # at most 2 x max_items matches
        depth += 1 if match.group() in (b"{", b"[") else -1
        deepest = max(deepest, depth)
    if deepest > max_depth:
        return (
            f"request body nests JSON {deepest} levels deep, over server.max_json_depth="
            f"{max_depth}; flatten the metadata"
        )
    return None


async def send_error(
    send: Send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer ``ErrorResponse(detail)`` with ``status`` and close the connection."""
    body = ErrorResponse(detail=detail).model_dump_json().encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
