"""A real HTTP server on 127.0.0.1 for the released-engine tests: each route answers recorded
bytes (or a function of the request body) and every request is kept for the assertions."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, str, bytes]  # status, content type, body


@dataclass(kw_only=True)
class Route:
    """``answer``: fixed bytes, or a function of the request body returning them."""

    answer: Answer | Callable[[bytes], Answer]


@dataclass(kw_only=True)
class Loopback:
    url: str
    routes: dict[tuple[str, str], Route]
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies posted to ``path``, in order."""
        return [json.loads(b) for m, p, b in self.requests if m == "POST" and p == path]


def json_answer(value: Any, status: int = 200) -> Answer:
    return status, "application/json", json.dumps(value).encode()


@contextmanager
def loopback(routes: dict[tuple[str, str], Route]) -> Iterator[Loopback]:
    """Serve ``routes`` (``(method, path) -> Route``) on a free loopback port."""
    state = Loopback(url="", routes=routes)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            state.requests.append((method, self.path, body))
            route = state.routes.get((method, self.path))
            if route is None:
                status, ctype, data = 404, "application/json", b'{"detail": "Not Found"}'
            elif callable(route.answer):
                status, ctype, data = route.answer(body)
            else:
                status, ctype, data = route.answer
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
