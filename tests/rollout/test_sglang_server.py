"""The HTTP plumbing both SGLang adapters share (``unirl.rollout.engine.sglang_server``),
driven by httpx's mock transport and a fake server process: no sglang, no network."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from unirl.rollout.engine import sglang_server
from unirl.rollout.engine.sglang_server import ServerSleep, SGLangServerClient, wait_until_healthy


def client_answering(handler: Any, cls: type[SGLangServerClient] = SGLangServerClient) -> Any:
    client = cls(base_url="http://server:30000/", api_key="k")
    assert client.base_url == "http://server:30000"
    assert client.http.headers["Authorization"] == "Bearer k"
    client.http = httpx.Client(base_url=client.base_url, transport=httpx.MockTransport(handler))
    return client


def test_post_returns_json_and_sleep_wake_routes() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json={"success": True, "path": request.url.path})

    client = client_answering(handler)
    assert client.release_memory() == {"success": True, "path": "/release_memory_occupation"}
    assert client.resume_memory() == {"success": True, "path": "/resume_memory_occupation"}
    assert seen == ["/release_memory_occupation", "/resume_memory_occupation"]


def test_http_error_names_route_and_status_and_keeps_the_text() -> None:
    class Short(SGLangServerClient):
        error_text_chars = 4

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="overloaded")

    with pytest.raises(RuntimeError, match=r"SGLang /x -> HTTP 503: .*'overloaded'"):
        client_answering(handler)._post("/x", {})
    with pytest.raises(RuntimeError, match=r"HTTP 503: .*'message': 'over'\}"):
        client_answering(handler, Short)._post("/x", {})
    ok_text = client_answering(lambda r: httpx.Response(200, text="plain"))._post("/x", {})
    assert ok_text == {"success": False, "message": "plain"}


class FakeProc:
    def __init__(self, exit_code: int | None) -> None:
        self.returncode = exit_code
        self.terminated = False

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.terminated = True


def test_wait_until_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match=r"^srv exited with code 3 during startup \(model m\)$"):
        wait_until_healthy(
            FakeProc(3),
            port=1,
            startup_timeout_s=5,
            server="srv",
            model_path="m",  # type: ignore[arg-type]
        )
    answers = iter([httpx.ConnectError("not yet"), httpx.Response(200)])

    def get(url: str, timeout: float) -> httpx.Response:
        assert url == "http://127.0.0.1:7/health"
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(httpx, "get", get)
    monkeypatch.setattr(sglang_server.time, "sleep", lambda s: None)
    proc = FakeProc(None)
    out = wait_until_healthy(proc, port=7, startup_timeout_s=5, server="srv", model_path="m")  # type: ignore[arg-type]
    assert out is proc and not proc.terminated
    with pytest.raises(TimeoutError, match=r"^srv did not answer /health within 0 s$"):
        wait_until_healthy(proc, port=7, startup_timeout_s=0, server="srv", model_path="m")  # type: ignore[arg-type]
    assert proc.terminated


class _Memory:
    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def release_memory(self) -> dict[str, Any]:
        return self.reply

    def resume_memory(self) -> dict[str, Any]:
        return self.reply


def test_server_sleep_reads_success_and_what_an_unsaid_one_means() -> None:
    class Strict(ServerSleep):
        def __init__(self, reply: dict[str, Any]) -> None:
            self.client, self.asleep = _Memory(reply), False

    class Lenient(Strict):
        success_if_unsaid = True

    engine = Strict({"success": True})
    assert engine.sleep() == {"success": True} and engine.asleep
    assert engine.wake_up() == {"success": True} and not engine.asleep
    with pytest.raises(RuntimeError, match=r"^sglang release_memory_occupation failed: \{\}$"):
        Strict({}).sleep()
    with pytest.raises(RuntimeError, match="resume_memory_occupation failed"):
        Lenient({"success": False}).wake_up()
    lenient = Lenient({})
    assert lenient.sleep() == {} and lenient.asleep
