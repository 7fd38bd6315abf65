"""Run the app on a loopback port inside the current process (tests, notebooks)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", startup_s: float = 20.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a daemon thread on a free port; yields the base URL.

    An app from :func:`~unirl_reward_service.create_app` is served with its config's
    connection limits and timeouts (:func:`~unirl_reward_service.connections.uvicorn_config`),
    as the CLI does. The socket is bound before uvicorn starts (no port race). On exit the
    server shuts down (which runs the app's lifespan shutdown: the reward pools stop).
    """
    import uvicorn

    from unirl_reward_service.connections import uvicorn_config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    settings = {
        "log_level": "warning",
        "lifespan": "on",
        "timeout_graceful_shutdown": 5,
        "access_log": False,
    }
    reward_server = getattr(app.state, "reward_server", None)
    if reward_server is not None:
        config = uvicorn_config(app, reward_server.config.server, **settings)
    else:
        config = uvicorn.Config(app, **settings)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="reward-service", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the reward service did not start on {host}:{port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(15.0)
        sock.close()
