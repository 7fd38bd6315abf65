"""The HunyuanImage-3.0 adapter (``Hi3OmniEngine``) against a fake HTTP server that answers
its route as the README's wire format says: the request it sends (x_T bytes, σ, SDE steps,
text knobs), the two tracks it builds (exact values), and each contract violation refused
with the sample and field named. The real model is never run (80B; no weights here)."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from unirl.models.unified import ContextConditions
from unirl.rollout.engine.vllm_omni.hi3 import (
    ROUTE,
    Hi3ContractError,
    Hi3OmniEngine,
    decode_array,
    encode_array,
)
from unirl.types import (
    ARSamplingParams,
    DiffusionRequest,
    DiffusionSamplingParams,
    LatentSegment,
    RolloutReq,
    TextRequest,
    Texts,
    TextSegment,
)

SHAPE = (4, 2, 2)
SIGMAS = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])


def png_of(value: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def answer(body: dict[str, Any], break_: str | None) -> dict[str, Any]:
    """What a conforming server returns (deterministic in the request), then broken as asked."""
    out = []
    for s in body["samples"]:
        sid, image = s["sample_id"], s["image"]
        x_T = decode_array(image["x_T"], "x_T")
        steps = len(image["sde_indices"])
        n_out = 1 + sid % 3
        sample = {
            "sample_id": sid,
            "prompt_token_ids": [7, 8, 9][: 2 + sid % 2],
            "output_token_ids": [100 + sid + k for k in range(n_out)],
            "output_log_probs": [-0.5 * (k + 1) for k in range(n_out)],
            "finish_reason": "length" if n_out == s["text"]["max_new_tokens"] else "stop",
            "text": f"thought {sid}",
            "timesteps": [1000.0 * v for v in image["sigmas"]],
            "sde_latents": encode_array(torch.stack([x_T * (k + 1) for k in range(steps)])),
            "sde_next_latents": encode_array(torch.stack([x_T * (k + 2) for k in range(steps)])),
            "sde_log_probs": [-1.0 - k for k in range(steps)],
            "final_latents": encode_array(x_T * 0.5),
            "image_png": png_of(10 * sid),
        }
        out.append(sample)
    if break_ == "timesteps":
        out[1]["timesteps"][2] += 5.0
    elif break_ == "sample_id":
        out[0]["sample_id"] = 99
    elif break_ == "logprobs":
        out[1]["output_log_probs"] = out[1]["output_log_probs"][:-1]
    elif break_ == "shape":
        out[0]["final_latents"] = encode_array(torch.zeros(3, 2, 2))
    elif break_ == "count":
        out = out[:-1]
    return {"samples": out}


class FakeServer:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.break_: str | None = None
        self.status = 200
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append({"path": self.path, **body})
                if self.path == ROUTE and server.status == 200:
                    data = json.dumps(answer(body, server.break_)).encode()
                    self.send_response(200)
                elif self.path in ("/sleep", "/wake_up"):
                    data = b"{}"
                    self.send_response(200)
                else:
                    data = b"engine failed"
                    self.send_response(server.status if server.status != 200 else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.httpd.shutdown()


def request() -> RolloutReq:
    n = 4
    params = DiffusionSamplingParams(
        num_inference_steps=4, guidance_scale=5.0, height=16, width=16, eta=0.7
    )
    return RolloutReq(
        sample_ids=torch.arange(10, 10 + n),
        group_ids=torch.tensor([0, 0, 1, 1]),
        primitives={"text": Texts(texts=["a cat", "a cat", "a dog", "a dog"])},
        metadata=[{"k": i} for i in range(n)],
        stage_params={
            "text": TextRequest(
                seed_ids=torch.arange(10, 10 + n), max_new_tokens=3, temperature=0.9
            ),
            "image": DiffusionRequest(
                init_noise_ids=torch.arange(10, 10 + n),
                sde_indices=torch.tensor([[0, 2]] * n),
                sigmas=SIGMAS,
                init_noise_shape=SHAPE,
                sampling_params=params,
            ),
        },
        sampling_params=ARSamplingParams(max_new_tokens=3),
        seed=5,
        rollout_index=3,
    )


def test_request_pins_noise_sigmas_and_sde_steps_and_tracks_map_exactly(server: FakeServer) -> None:
    engine = Hi3OmniEngine(base_url=server.url, mode="recaption")
    server.break_ = None
    req = request()
    resp = engine.generate(req)
    body = server.bodies[-1]
    assert body["path"] == ROUTE and body["mode"] == "recaption" and body["seed"] == 5
    x_T = req.params_for("image", DiffusionRequest).initial_noise(5)
    for i, s in enumerate(body["samples"]):
        assert s["prompt"] == req.prompts[i] and s["text"]["seed_id"] == 10 + i
        assert s["text"]["max_new_tokens"] == 3 and s["text"]["temperature"] == pytest.approx(0.9)
        assert s["image"]["sigmas"] == SIGMAS.tolist() and s["image"]["sde_indices"] == [0, 2]
        assert s["image"]["guidance_scale"] == 5.0
        assert torch.equal(decode_array(s["image"]["x_T"], "x_T"), x_T[i])  # bit for bit

    text, image = resp.tracks["text"], resp.tracks["image"]
    assert isinstance(text.segment, TextSegment) and isinstance(image.segment, LatentSegment)
    for i in range(4):
        sid = 10 + i
        prompt, n_out = [7, 8, 9][: 2 + sid % 2], 1 + sid % 3
        out = [100 + sid + k for k in range(n_out)]
        assert text.segment.tokens.row(i).tolist() == prompt + out
        assert text.segment.loss_mask.row(i).tolist() == [False] * len(prompt) + [True] * n_out
        assert text.segment.log_probs.row(i).tolist() == [0.0] * len(prompt) + [
            -0.5 * (k + 1) for k in range(n_out)
        ]
        assert int(text.conditions.prompt_lengths[i]) == len(prompt)
        assert text.metadata[i]["response_tokens"] == n_out and text.metadata[i]["k"] == i
        assert isinstance(image.conditions, ContextConditions)
        assert image.conditions.context.row(i).tolist() == prompt + out  # exact ids
        assert torch.equal(image.segment.latents[i, 1], x_T[i] * 2)
        assert torch.equal(image.segment.next_latents[i, 0], x_T[i] * 2)
        assert torch.equal(image.segment.final_latents[i], x_T[i] * 0.5)
        assert image.segment.sde_logp[i].tolist() == [-1.0, -2.0]
        assert torch.allclose(image.decoded.pixels[i], torch.full((3, 8, 8), 10 * sid / 255))
    assert text.conditions.temperature == pytest.approx(0.9)
    assert image.parent_ids.tolist() == [10, 11, 12, 13] and image.parent_track == "text"
    assert text.decoded.texts[2] == "thought 12" and image.metadata[2]["thought"] == "thought 12"
    assert "vllm_omni/call" in resp.timings


@pytest.mark.parametrize(
    ("break_", "message"),
    [
        ("timesteps", "sample 11: timesteps .* not 1000·σ"),
        ("sample_id", "sample 10: the answer's sample 0 has sample_id 99"),
        ("logprobs", "sample 11: 3 output tokens but 2 output_log_probs"),
        ("shape", r"sample 10: final_latents: shape \(3, 2, 2\), expected \(4, 2, 2\)"),
        ("count", "expected 4 samples in the answer, got 3"),
    ],
)
def test_contract_violations_name_the_sample_and_field(
    server: FakeServer, break_: str, message: str
) -> None:
    server.break_ = break_
    try:
        with pytest.raises(Hi3ContractError, match=message):
            Hi3OmniEngine(base_url=server.url).generate(request())
    finally:
        server.break_ = None


def test_http_errors_surface_and_sleep_wake_reach_the_server(server: FakeServer) -> None:
    engine = Hi3OmniEngine(base_url=server.url)
    server.status = 503
    try:
        with pytest.raises(RuntimeError, match="HTTP 503: engine failed"):
            engine.generate(request())
    finally:
        server.status = 200
    engine.sleep()
    engine.wake_up()
    assert [b["path"] for b in server.bodies[-2:]] == ["/sleep", "/wake_up"]


def test_bad_mode_is_refused() -> None:
    from unirl.config.require import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.mode='draw' must be 'think' or 'recaption'"):
        Hi3OmniEngine(mode="draw")  # type: ignore[arg-type]


def test_hi3_recipe_dry_runs_and_a_run_is_refused_before_ray(tmp_path, capsys) -> None:
    from unirl.config.entry import compose_recipe
    from unirl.config.require import ConfigError
    from unirl.train_unified_model import run

    overrides = [f"output_dir={tmp_path / 'run'}"]
    assert run(compose_recipe("unified_model/hi3_vllmomni", [*overrides, "dry_run=true"])) == 0
    printed = capsys.readouterr().out
    assert "Hi3OmniEngine" in printed and "LoraSync" in printed and "sampler" not in printed
    assert "samples_per_rollout          128" in printed
    with pytest.raises(ConfigError, match=r"the trainer side of HunyuanImage-3\.0 .* is not built"):
        run(compose_recipe("unified_model/hi3_vllmomni", overrides))
    assert not (tmp_path / "run").exists()  # refused before the run wrote anything
