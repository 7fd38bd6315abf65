"""The HTTP plumbing both SGLang adapters share: one server's client (JSON posts, an HTTP error
mapped to one ``RuntimeError`` naming the route, sleep / wake) and the wait for a launched
server's ``/health``.

The diffusion adapter (``sglang/client.py``, ``sglang serve``) and the language-model adapter
(``sglang_llm/client.py``, ``sglang.launch_server``) subclass :class:`SGLangServerClient` with
their own routes and call :func:`wait_until_healthy` after starting their server; both
engines take ``sleep`` / ``wake_up`` from :class:`ServerSleep`. httpx is
imported when a client is built or a server awaited, never at import.

:meth:`SGLangServerClient.check_version` reads ``GET /server_info`` (both servers answer
``version`` there) and compares it with ``SUPPORTED_SGLANG_VERSIONS``, the releases whose wire
format the tests pin (``tests/fixtures/engines/sglang-<version>/``).
"""

from __future__ import annotations

import logging
import subprocess
import time
from typing import Any, ClassVar

from unirl.distributed.group.dispatch import Dispatch, distributed

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)

logger = logging.getLogger(__name__)


class UnsupportedServerVersion(RuntimeError):
    """The server runs an SGLang release whose wire format is not pinned by the tests."""


class SGLangServerClient:
    """Talks to one server at ``base_url`` (e.g. ``http://127.0.0.1:30000``), with a bearer
    ``api_key`` when given. ``error_text_chars``: how much of a non-JSON answer's text the
    error keeps (``None``: all of it)."""

    error_text_chars: ClassVar[int | None] = None

    def __init__(
        self, *, base_url: str, timeout_s: float = 600.0, api_key: str | None = None
    ) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer of ``POST path``; an answer that is not JSON reads
        ``{"success": False, "message": <text>}``; HTTP 4xx / 5xx raise ``RuntimeError``."""
        resp = self.http.post(path, json=body)
        try:
            data = resp.json()
        except ValueError:
            data = {"success": False, "message": resp.text[: self.error_text_chars]}
        if resp.status_code >= 400:
            raise RuntimeError(f"SGLang {path} -> HTTP {resp.status_code}: {data}")
        return data

    def server_version(self) -> str | None:
        """``version`` from ``GET /server_info``; ``None`` when the server has no such route."""
        resp = self.http.get("/server_info")
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise RuntimeError(f"SGLang /server_info -> HTTP {resp.status_code}: {resp.text[:200]}")
        version = resp.json().get("version")
        return None if version is None else str(version)

    def check_version(self, *, strict: bool = False) -> str | None:
        """The server's version; one warning line (``strict``: an ``UnsupportedServerVersion``)
        when it is not one of ``SUPPORTED_SGLANG_VERSIONS``."""
        version = self.server_version()
        if version in SUPPORTED_SGLANG_VERSIONS:
            return version
        line = (
            f"SGLang server at {self.base_url} runs "
            f"{'sglang ' + version if version else 'an unknown version (no /server_info version)'}; "
            f"unirl's SGLang clients are tested against sglang {', '.join(SUPPORTED_SGLANG_VERSIONS)}"
        )
        if strict:
            raise UnsupportedServerVersion(
                f"{line} (set rollout.strict_version=false to run anyway)"
            )
        logger.warning(line)
        return version

    def release_memory(self) -> dict[str, Any]:
        """Sleep: the server frees its GPU memory (``/release_memory_occupation``)."""
        return dict(self._post("/release_memory_occupation", {}))

    def resume_memory(self) -> dict[str, Any]:
        """Wake: the server takes its GPU memory back (``/resume_memory_occupation``)."""
        return dict(self._post("/resume_memory_occupation", {}))


def wait_until_healthy(
    proc: subprocess.Popen[bytes],
    *,
    port: int,
    startup_timeout_s: float,
    server: str,
    model_path: str,
) -> subprocess.Popen[bytes]:
    """``proc`` once ``http://127.0.0.1:<port>/health`` answers 200 (polled every 2 s). A
    server that exits first raises ``RuntimeError``; one silent for ``startup_timeout_s`` is
    terminated and raises ``TimeoutError``; ``server`` names it in both (``sglang serve``)."""
    import httpx

    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{server} exited with code {proc.returncode} during startup (model {model_path})"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    proc.terminate()
    raise TimeoutError(f"{server} did not answer /health within {startup_timeout_s:g} s")


class ServerSleep:
    """``sleep`` / ``wake_up`` of an engine whose SGLang server holds the weights (``client``:
    an :class:`SGLangServerClient`; ``asleep`` tracks it). A reply whose ``success`` is false
    raises naming the route; ``success_if_unsaid``: how a reply without the key reads (the
    language-model server's memory routes may omit it)."""

    client: Any
    asleep: bool
    success_if_unsaid: ClassVar[bool] = False

    @distributed(dispatch=Dispatch.BROADCAST)
    def sleep(self) -> dict[str, Any]:
        """Release the server's GPU memory (``/release_memory_occupation``)."""
        out = self.client.release_memory()
        if not out.get("success", self.success_if_unsaid):
            raise RuntimeError(f"sglang release_memory_occupation failed: {out}")
        self.asleep = True
        return out

    @distributed(dispatch=Dispatch.BROADCAST)
    def wake_up(self) -> dict[str, Any]:
        out = self.client.resume_memory()
        if not out.get("success", self.success_if_unsaid):
            raise RuntimeError(f"sglang resume_memory_occupation failed: {out}")
        self.asleep = False
        return out


__all__ = [
    "SUPPORTED_SGLANG_VERSIONS",
    "SGLangServerClient",
    "ServerSleep",
    "UnsupportedServerVersion",
    "wait_until_healthy",
]
