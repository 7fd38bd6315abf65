"""Attacks on the real server process (the CLI in a subprocess, loopback only): decompression
bombs, idle and slow connections, requests without the token, tokens in URLs, log floods.

Bounds asserted (the server's own /proc numbers, not the test's):

- a refused decompression bomb raises the server's peak RSS (VmHWM, reset before each
  attack) by at most ``RSS_BOUND_MB`` = 100 MB over its idle level; decoded, the 16-image
  request alone would hold 16 x 48 MB of RGB pixels;
- ``IDLE_SOCKETS`` = 300 idle sockets leave the server holding at most
  ``MAX_CONNECTIONS`` (+4 in transit) of them, and none after ``HEADER_TIMEOUT_S``;
- a flood of idle, slow or garbage connections adds at most a few lines to the log.

Every loop is bounded in count and time; the module takes about 10 s.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import HTTPException
from PIL import Image

from unirl_reward_service import cli
from unirl_reward_service.app import PixelBudget
from unirl_reward_service.codec import encode_png

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads the server's RSS and fds from /proc"
)

HOST = "127.0.0.1"
TOKEN_ENV = "UNIRL_HARDENING_TOKEN"
TOKEN = "hardening-token-8d1f2c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REWARD = "secret_brightness_reward"
MAX_CONNECTIONS = 32
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
BUDGET_PIXELS = 4096 * 4096
IDLE_SOCKETS = 300
RSS_BOUND_MB = 100
LOG_BOUND_BYTES = 4096
CONFIG = f"""
server:
  auth_token_env: {TOKEN_ENV}
  max_request_bytes: 2000000
  max_batch_size: 32
  max_frames: 64
  max_image_pixels: {BUDGET_PIXELS}
  max_sample_pixels: {BUDGET_PIXELS}
  max_request_pixels: {BUDGET_PIXELS}
  max_inflight_pixels: {2 * BUDGET_PIXELS}
  max_connections: {MAX_CONNECTIONS}
  header_timeout_s: {HEADER_TIMEOUT_S}
  body_timeout_s: {BODY_TIMEOUT_S}
  keep_alive_s: 1
rewards:
  {REWARD}: {{_target_: unirl.reward.local.BrightnessTarget}}
"""


@dataclass
class Served:
    url: str
    port: int
    pid: int
    log: Path

    def log_size(self) -> int:
        return self.log.stat().st_size


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("hardening")
    config = folder / "service.yaml"
    config.write_text(CONFIG)
    log = folder / "server.log"
    port = _free_port()
    command = [sys.executable, "-m", "unirl_reward_service", "--config", str(config)]
    command += ["--port", str(port), "--log-level", "info"]
    env = {**os.environ, TOKEN_ENV: TOKEN, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert process.poll() is None, log.read_text()
        assert_scores(url)  # warm-up: the idle RSS below includes a served request
        yield Served(url=url, port=port, pid=process.pid, log=log)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def assert_scores(url: str) -> None:
    image = encode_png(np.full((8, 8, 3), 51, dtype=np.uint8))
    answer = httpx.post(
        url + "/score", json={"reward": REWARD, "images": [image]}, headers=AUTH, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"][REWARD]["samples"][0]["error"] is None


# -- /proc readings of the server ----------------------------------------------------------


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextmanager
def peak_rss_rise_mb(pid: int) -> Iterator[dict[str, float]]:
    """Peak RSS of ``pid`` during the block minus its RSS before, in MB.

    Reads VmHWM after resetting it (``clear_refs``); where the reset is not allowed, a
    sampler thread's maximum of VmRSS (every 2 ms) stands in.
    """
    before = _status_kb(pid, "VmRSS")
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    sampled = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            sampled.append(_status_kb(pid, "VmRSS"))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result: dict[str, float] = {}
    try:
        yield result
    finally:
        done.set()
        sampler.join(5)
        peak = max(max(sampled), _status_kb(pid, "VmHWM") if reset else 0)
        result["mb"] = (peak - before) / 1024


# -- raw loopback sockets ------------------------------------------------------------------


def read_answer(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout_s``)."""
    sock.settimeout(timeout_s)
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    return data


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (any answer it sent first is read and dropped)."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- payloads ------------------------------------------------------------------------------


def png_claiming(width: int, height: int) -> str:
    """A ~70-byte PNG whose header claims ``width x height`` RGB (its pixel data is bogus)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
    data += chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    return base64.b64encode(data).decode()


def one_bit_png(size: int) -> str:
    """A real ~2 KB black PNG of ``size x size`` (1 bit per pixel; RGB: 3 bytes per pixel)."""
    buffer = io.BytesIO()
    Image.new("1", (size, size)).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode()


def black_mp4(frames: int, width: int, height: int) -> str:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "51"}
        frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), "rgb24")
        for _ in range(frames):
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return base64.b64encode(buffer.getvalue()).decode()


# -- 1. decoded-size budgets ---------------------------------------------------------------


def test_decompression_bombs_are_413_before_decoding(served):
    bomb = one_bit_png(4096)  # 2 KB; decoded 4096x4096 RGB = 48 MB
    cases = [
        # Pillow's own bomb threshold (179 M pixels) is crossed: still our 413, not a 422.
        ({"images": [png_claiming(20000, 20000)]}, "images[0]: Image size (400000000 pixels)"),
        ({"images": [png_claiming(8000, 8000)]}, "images[0]: 8000x8000 image has 64000000"),
        ({"images": [bomb] * 16}, "images[0..1] decode to 33554432 pixels"),
        ({"videos": [[bomb, bomb]], "fps": 8.0}, "videos[0]: decodes to 33554432 pixels"),
    ]
    for body, message in cases:
        with peak_rss_rise_mb(served.pid) as rise:
            answer = httpx.post(
                served.url + "/score", json={"reward": REWARD, **body}, headers=AUTH, timeout=30
            )
        assert answer.status_code == 413, answer.text
        assert answer.json()["detail"].startswith(message), answer.json()["detail"]
        assert rise["mb"] < RSS_BOUND_MB, (message, rise)
        print(f"\n{message}: 413, server peak RSS +{rise['mb']:.1f} MB")

    # Three such requests at once (the reported attack): each refused, RSS still bounded.
    answers: list[int] = []

    def attack() -> None:
        body = {"reward": REWARD, "images": [bomb] * 16}
        answers.append(
            httpx.post(served.url + "/score", json=body, headers=AUTH, timeout=30).status_code
        )

    with peak_rss_rise_mb(served.pid) as rise:
        threads = [threading.Thread(target=attack) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert answers == [413, 413, 413]
    assert rise["mb"] < RSS_BOUND_MB, rise
    print(f"3 concurrent 16-bomb requests: 413 x3, server peak RSS +{rise['mb']:.1f} MB")
    assert_scores(served.url)


def test_mp4_bombs_are_413_from_the_container_header(served):
    pytest.importorskip("av", reason="pip install av for mp4 payloads")
    cases = [
        # 64 frames of 1024x1024 in 6 KB: 67 M pixels, four times the per-sample budget.
        (black_mp4(64, 1024, 1024), "videos[0]: decodes to 67108864 pixels"),
        (black_mp4(100, 64, 64), "videos[0]: video has 100 frames"),
        (black_mp4(1, 4160, 4096), "videos[0]: 4160x4096 frames exceed"),
    ]
    for video, message in cases:
        with peak_rss_rise_mb(served.pid) as rise:
            answer = httpx.post(
                served.url + "/score",
                json={"reward": REWARD, "videos": [video], "fps": 8.0},
                headers=AUTH,
                timeout=30,
            )
        assert answer.status_code == 413, answer.text
        assert answer.json()["detail"].startswith(message), answer.json()["detail"]
        assert rise["mb"] < RSS_BOUND_MB, (message, rise)
        print(f"\n{message}: 413, server peak RSS +{rise['mb']:.1f} MB")
    assert_scores(served.url)


def test_inflight_pixel_budget_waits_then_503():
    async def scenario() -> None:
        budget = PixelBudget(100)
        order: list[str] = []

        async def second() -> None:
            async with budget.hold(60, 5.0):
                order.append("second")

        async with budget.hold(60, 1.0):
            task = asyncio.create_task(second())
            await asyncio.sleep(0.05)
            assert order == []  # 60 + 60 > 100: it waits
        await asyncio.wait_for(task, 5.0)
        assert order == ["second"] and budget.held == 0
        async with budget.hold(100, 1.0):
            with pytest.raises(HTTPException) as refused:
                async with budget.hold(1, 0.05):
                    pass
        assert refused.value.status_code == 503
        assert refused.value.headers == {"Retry-After": "1"}
        assert budget.held == 0

    asyncio.run(scenario())


# -- 2. connection limits and timeouts -----------------------------------------------------


def test_idle_sockets_are_capped_then_timed_out_and_clients_still_get_in(served):
    base_fds = open_fds(served.pid)
    log_before = served.log_size()
    sockets: list[socket.socket] = []
    try:
        for _ in range(IDLE_SOCKETS):
            sockets.append(socket.create_connection((HOST, served.port), timeout=5))
        over = IDLE_SOCKETS - MAX_CONNECTIONS
        assert wait_until(lambda: sum(map(closed_by_server, sockets)) >= over, 5.0)
        held = open_fds(served.pid) - base_fds
        assert held <= MAX_CONNECTIONS + 4, held
        print(f"\n{IDLE_SOCKETS} idle sockets: server holds {held} more fds than idle")
        # 300 idle sockets are still open on this side; a real client gets in anyway: its
        # connection replaces the longest-idle one, once that one has been idle for
        # min(1 s, header_timeout_s / 10) = 0.1 s (a burst of fresh connections gets 503s).
        time.sleep(0.2)
        assert_scores(served.url)
        assert wait_until(lambda: all(map(closed_by_server, sockets)), HEADER_TIMEOUT_S + 3)
        assert wait_until(lambda: open_fds(served.pid) <= base_fds + 1, 3.0)
    finally:
        for sock in sockets:
            sock.close()
    grown = served.log_size() - log_before
    text = served.log.read_text()
    print(f"fds after the header timeout: {open_fds(served.pid) - base_fds:+d}; log +{grown} B")
    assert grown < LOG_BOUND_BYTES, text[-2000:]
    assert "Traceback" not in text


def test_slowloris_headers_are_cut_at_the_header_timeout(served):
    with socket.create_connection((HOST, served.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed_after = None
        for i in range(40):  # one header byte every 0.1 s, at most 4 s
            time.sleep(0.1)
            try:
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
            except OSError:
                closed_after = time.monotonic() - started
                break
            if closed_by_server(sock):
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None
    assert HEADER_TIMEOUT_S - 0.1 <= closed_after <= HEADER_TIMEOUT_S + 1.0, closed_after


def test_slow_bodies_get_408_and_a_full_server_answers_503(served):
    slow_head = head(
        "POST",
        "/score",
        {**AUTH, "Content-Type": "application/json", "Content-Length": "1000",
         "Expect": "100-continue"},
    )  # fmt: skip
    slow: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = socket.create_connection((HOST, served.port), timeout=5)
            sock.sendall(slow_head)
            # "100 Continue" means the server is reading this body: the request is in progress.
            assert sock.recv(64).startswith(b"HTTP/1.1 100"), "no 100 Continue"
            sock.sendall(b'{"reward": ')
            slow.append(sock)
        started = time.monotonic()
        with socket.create_connection((HOST, served.port), timeout=5) as extra:
            busy = read_answer(extra, 3.0)
        assert status_of(busy) == 503, busy
        assert b"retry-after: 1" in busy.lower()
        answers = [read_answer(sock, BODY_TIMEOUT_S + 3) for sock in slow]
        elapsed = time.monotonic() - started
        assert [status_of(a) for a in answers] == [408] * MAX_CONNECTIONS, answers[0]
        assert b"server.body_timeout_s=1" in answers[0]
        assert elapsed < BODY_TIMEOUT_S + 2.5, elapsed
    finally:
        for sock in slow:
            sock.close()
    assert_scores(served.url)


def test_garbage_requests_do_not_flood_the_log(served):
    log_before = served.log_size()
    started = time.monotonic()
    statuses = []
    for _ in range(200):
        with socket.create_connection((HOST, served.port), timeout=5) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            statuses.append(status_of(read_answer(sock, 2.0)))
        assert time.monotonic() - started < 20
    assert statuses == [400] * 200
    assert served.log_size() - log_before < LOG_BOUND_BYTES
    assert_scores(served.url)


# -- 3. authentication ---------------------------------------------------------------------


def test_no_or_wrong_token_is_401_before_the_body_is_read(served):
    for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        # The head announces 1 MB that never comes: the 401 cannot have waited for it (the
        # body timeout would have answered 408 after 1 s).
        request = head(
            "POST",
            "/score",
            {**auth, "Content-Type": "application/json", "Content-Length": "999999"},
        )
        with socket.create_connection((HOST, served.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(request)
            answer = read_answer(sock, 3.0)
            elapsed = time.monotonic() - started
        assert status_of(answer) == 401, answer
        assert b"www-authenticate: Bearer" in answer
        assert elapsed < BODY_TIMEOUT_S / 2, elapsed
    for path in ("/rewards", "/no/such/path"):
        assert httpx.get(served.url + path).status_code == 401


def test_token_in_the_query_string_is_refused_and_never_logged(served):
    secret = "leaked-in-url-5f3a"
    answers = [
        httpx.get(served.url + f"/rewards?token={secret}", headers=AUTH),
        httpx.get(served.url + "/rewards", params={"access_token": secret}),
        httpx.post(served.url + f"/score?auth={secret}", json={"reward": REWARD}),
        httpx.get(served.url + f"/health?token={secret}"),
    ]
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert "never in the URL" in answer.json()["detail"]
    assert wait_until(lambda: served.log.read_text().count("?<redacted>") >= 4, 3.0)
    assert secret not in served.log.read_text()


def test_health_and_openapi_hide_reward_names_without_the_token(served):
    health = httpx.get(served.url + "/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["rewards"] is None
    for path in ("/openapi.json", "/docs"):
        answer = httpx.get(served.url + path)
        assert answer.status_code == 200 and REWARD not in answer.text, path
    with_token = httpx.get(served.url + "/health", headers=AUTH).json()
    assert list(with_token["rewards"]) == [REWARD]


def test_no_token_configured_refuses_to_start(tmp_path, capsys):
    path = tmp_path / "service.yaml"
    path.write_text("rewards:\n  jpeg: {_target_: unirl.reward.local.JpegCompressibility}\n")
    assert cli.main(["--config", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert "server.auth_token_env" in error and "server.require_auth: false" in error
