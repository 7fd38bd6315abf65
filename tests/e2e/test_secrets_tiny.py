"""No credential in anything a run writes or prints: a tiny run whose reward service is
reached at ``http://user:PASSWORD@host`` and (a second component) with a bearer ``token``
given on the command line,
logging to the local files (``train.log``, ``metrics.jsonl``, ``config.yaml``), TensorBoard
and W&B in offline mode (``WANDB_MODE=offline``: the run files an online run uploads, the
``.wandb`` transaction log, ``wandb-metadata.json``, W&B's ``config.yaml`` and its console
capture ``output.log``, its debug logs), with a checkpoint and an eval; then every file the
run wrote (under ``output_dir``, the working directory and W&B's config / cache / data
folders, all inside the test's folder; binary ones too) and the console are searched for
both secrets."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("httpx", reason="RemoteRewardBackend needs httpx")
pytest.importorskip("tensorboard", reason="the run logs to TensorBoard too")
pytest.importorskip("wandb", reason="the run logs to W&B (offline) too")

PASSWORD = "pw-Zq81XkLmN0"  # in the reward URL
TOKEN = "tok-Hh27PpYy55"  # the bearer token, a command-line override
REWARDS = {
    "rewards": [
        {"name": "mean", "components": ["mean"], "has_total": False, "scalar": True, "timeout_s": 5}
    ],
    "limits": {"max_batch_size": 64},
    "auth": False,
}


@contextmanager
def reward_stub() -> Iterator[str]:
    """A reward service answering each image's mean pixel."""

    class Handle(BaseHTTPRequestHandler):
        def _reply(self, body: dict, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply(REWARDS)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            means = [
                float(
                    np.asarray(Image.open(io.BytesIO(base64.b64decode(im))).convert("RGB")).mean()
                )
                / 255.0
                for im in body["images"]
            ]
            samples = [{"score": m, "error": None, "components": {"mean": m}} for m in means]
            self._reply({"results": {body["reward"]: {"samples": samples}}})

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://unirl:{PASSWORD}@127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def bare(url: str) -> str:
    """``url`` without its ``user:password@``."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.split('@', 1)[1]}"


def test_no_secret_in_any_file_or_stream_of_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with reward_stub() as url:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "unirl.train_diffusion",
                "--config-name=diffusion/sd3_tiny_trainside",
                f"output_dir={out}",
                "num_rollouts=2",
                "save_interval=2",
                "eval_interval=2",
                "eval.num_prompts=2",
                "logging.trackers=[local,tensorboard,wandb]",
                "~reward.backend",
                # two remote components: one reached with the URL's credentials, one with
                # the bearer token (one Authorization header per request: not both at once)
                "+reward.backend={_target_: unirl.reward.WeightedRewardBackend, components: "
                f"{{a: {{_target_: unirl.reward.RemoteRewardBackend, url: '{url}', reward: mean}}, "
                f"b: {{_target_: unirl.reward.RemoteRewardBackend, url: '{bare(url)}', "
                "reward: mean}}, weights: {a: 0.5, b: 0.5}}",
                f"+reward.backend.components.b.token={TOKEN}",
            ],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "RAY_ADDRESS": "",
                "UNIRL_REPORT": "0",
                "WANDB_MODE": "offline",
                "WANDB_SILENT": "true",
                # W&B's own folders inside the searched tree, not the user's home
                **{
                    f"WANDB_{kind}_DIR": str(tmp_path / f"wandb_{kind.lower()}")
                    for kind in ("CONFIG", "CACHE", "DATA")
                },
            },
            cwd=tmp_path,
            timeout=400,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any("tfevents" in p.name for p in files) and (out / "train.log").is_file()
    assert (out / "metrics.jsonl").is_file() and (out / "config.yaml").is_file()
    assert any(p.name == "driver_state.json" for p in files)  # a checkpoint was written
    # W&B's offline run: the transaction log (the run's config, its metadata with the command
    # line, the metrics: what an online run uploads), its files and debug logs
    run_logs = [p for p in files if p.suffix == ".wandb"]
    assert len(run_logs) == 1, [str(p) for p in files if "wandb" in str(p)]
    run_dir = run_logs[0].parent
    for name in ("files/output.log", "files/requirements.txt", "logs/debug.log"):
        assert (run_dir / name).is_file(), name
    # the search sees into the binary log: the config's masked URL and token, the command
    # line's masked token override and a metric are there, in plain bytes
    log_bytes = run_logs[0].read_bytes()
    for masked in (
        b"unirl:***REDACTED***@127.0.0.1",
        b'"token":"***REDACTED***"',
        b"token=***REDACTED***",
        b"reward/mean",
    ):
        assert masked in log_bytes, masked
    assert "'token': '***REDACTED***'" in (run_dir / "logs/debug.log").read_text()
    leaks = [
        f"{p.relative_to(tmp_path)} holds {name}"
        for p in files
        for name, secret in (("the URL password", PASSWORD), ("the token", TOKEN))
        if secret.encode() in p.read_bytes()
    ]
    leaks += [
        f"{stream} holds {name}"
        for stream, text in (("stdout", done.stdout), ("stderr", done.stderr))
        for name, secret in (("the URL password", PASSWORD), ("the token", TOKEN))
        if secret in text
    ]
    assert not leaks, leaks
    # what was masked is still there, masked
    assert "unirl:***REDACTED***@127.0.0.1" in (out / "config.yaml").read_text()
