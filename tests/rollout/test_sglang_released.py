"""The real SGLang clients (``SGLangHttpClient``, ``SGLangTextClient``) and engines against
bytes made by the released sglang 0.5.23's own code (``tests/fixtures/engines/record_sglang.py``),
served by a real HTTP server on 127.0.0.1: the msgpack / safetensors answer of
``/rollout/generate``, the JSON of ``/generate``, the request body of
``/update_weights_from_tensor`` that the released deserializer read, and the version check
at connect time."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import pickle
import subprocess
from pathlib import Path

import msgpack
import pytest
import released_cases as cases
import torch
from loopback_server import Route, json_answer, loopback
from rollout_fakes import make_request, stage

from unirl.distributed.weight_sync import (
    SyncManifest,
    TensorMeta,
    WeightSyncError,
    encode_bucket,
    plan_buckets,
    tensor_checksum,
)
from unirl.rollout import SGLangEngine
from unirl.rollout.engine.sglang.client import (
    SGLangHttpClient,
    SGLangWireError,
    decode_rollout_body,
    sha256_like_sglang,
    tensor_from_wire,
)
from unirl.rollout.engine.sglang_llm import SGLangLLMEngine
from unirl.rollout.engine.sglang_llm.client import SGLangTextClient
from unirl.rollout.engine.sglang_server import SUPPORTED_SGLANG_VERSIONS, UnsupportedServerVersion
from unirl.types import Images, LatentSegment, RolloutReq, TextRequest, Texts

SD3 = "unirl.models.sd3.SD3Bundle"
ROLLOUT = (cases.SGLANG_DIR / "rollout_generate.msgpack").read_bytes()
GENERATE = (cases.SGLANG_DIR / "generate.json").read_bytes()
UPDATE = json.loads((cases.SGLANG_DIR / "update_weights_from_tensor.json").read_text())
INFO = ("GET", "/server_info")


def info(version: str = cases.SGLANG_VERSION) -> Route:
    return Route(answer=json_answer({"model_path": "m", "version": version}))


def rollout_route() -> Route:
    return Route(answer=(200, "application/msgpack", ROLLOUT))


# -- /rollout/generate ---------------------------------------------------------------------------


def test_fixture_is_what_the_issue_reported() -> None:
    """The released route sends tensor bytes as msgpack bin, which base64 decoding broke."""
    raw = msgpack.unpackb(ROLLOUT, raw=False)
    data = raw[0]["rollout_log_probs"]["data"]
    assert isinstance(data, bytes) and raw[0]["rollout_log_probs"]["dtype"] == "torch.float32"
    with pytest.raises(SGLangWireError, match="arrived as text"):
        tensor_from_wire({"__tensor__": True, "data": base64.b64encode(data).decode()})
    with pytest.raises(SGLangWireError, match="expected application/msgpack"):
        decode_rollout_body(ROLLOUT, "application/json")


def test_http_client_decodes_the_released_rollout_answer() -> None:
    batch = cases.diffusion_batch()
    with loopback({("POST", "/rollout/generate"): rollout_route(), INFO: info()}) as server:
        client = SGLangHttpClient(base_url=server.url)
        assert client.check_version(strict=True) == "0.5.23"
        samples = client.rollout_generate({"prompt": cases.PROMPT})
    assert server.bodies("/rollout/generate") == [{"prompt": cases.PROMPT}]
    assert len(samples) == cases.SAMPLES
    for i, s in enumerate(samples):
        assert (s["request_id"], s["prompt"], s["seed"]) == (
            "rollout-fixture",
            cases.PROMPT,
            cases.SEED,
        )
        assert torch.equal(s["generated_output"], batch["output"][i])
        assert torch.equal(s["rollout_log_probs"], batch["log_probs"][i])
        traj = s["dit_trajectory"]
        assert torch.equal(traj["latents"], batch["latents"][i])
        assert torch.equal(traj["sigmas"], batch["sigmas"])
        assert torch.equal(traj["timesteps"], batch["timesteps"])
        pos = s["denoising_env"]["pos_cond_kwargs"]
        assert pos["encoder_hidden_states"].dtype == torch.bfloat16
        assert torch.equal(pos["encoder_hidden_states"], batch["pos"]["encoder_hidden_states"][i])
        assert torch.equal(pos["pooled_projections"], batch["pos"]["pooled_projections"][i])
        assert s["rollout_debug_tensors"] is None and s["denoising_env"]["guidance"] is None


def test_engine_maps_the_released_answer_into_the_contract() -> None:
    """``SGLangEngine`` built on a server URL: connects (version checked), samples both prompt
    groups, and cuts the released trajectory at the request's SDE steps."""
    req = make_request(cases.SCHED, cases.LATENT, spp=cases.SAMPLES, steps=cases.STEPS)
    assert torch.allclose(stage(req).sigmas, cases.diffusion_sigmas())
    batch = cases.diffusion_batch()
    routes = {("POST", "/rollout/generate"): rollout_route(), INFO: info()}
    with loopback(routes) as server:
        engine = SGLangEngine(
            model_path="m", family=SD3, server_url=server.url, launch=False, storage_dtype="fp32"
        )
        resp = engine.generate(req)
    calls = server.bodies("/rollout/generate")
    assert [c["num_outputs_per_prompt"] for c in calls] == [2, 2]
    assert calls[0]["rollout_sde_step_indices"] == [0, 2, 4]
    track = resp.tracks["diffusion"]
    seg = track.segment
    assert isinstance(seg, LatentSegment)
    idx = torch.tensor([0, 2, 4])
    both = lambda t: torch.cat([t, t])  # noqa: E731 - each prompt group got the recorded pair
    assert torch.equal(seg.latents, both(batch["latents"][:, idx]))
    assert torch.equal(seg.next_latents, both(batch["latents"][:, idx + 1]))
    assert torch.equal(seg.final_latents, both(batch["latents"][:, -1]))
    assert torch.equal(seg.sde_logp, both(batch["log_probs"][:, idx]))
    assert torch.equal(
        track.conditions.prompt_embeds,
        both(batch["pos"]["encoder_hidden_states"]).to(track.conditions.prompt_embeds.dtype),
    )
    assert tuple(track.conditions.negative_pooled_prompt_embeds.shape) == (4, cases.POOLED)
    assert isinstance(track.decoded, Images)
    assert torch.equal(track.decoded.pixels, both(batch["output"]))


# -- version at connect time ------------------------------------------------------------------------


def test_version_check_names_both_versions_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    assert SUPPORTED_SGLANG_VERSIONS == ("0.5.23",)
    with loopback({INFO: info("0.5.30")}) as server:
        client = SGLangHttpClient(base_url=server.url)
        with caplog.at_level(logging.WARNING, logger="unirl.rollout.engine.sglang_server"):
            assert client.check_version() == "0.5.30"
        with pytest.raises(
            UnsupportedServerVersion,
            match=r"runs sglang 0\.5\.30; .* tested against sglang 0\.5\.23 \(set rollout.strict_version=false",
        ):
            SGLangEngine(
                model_path="m", family=SD3, server_url=server.url, launch=False, strict_version=True
            )
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"SGLang server at {server.url} runs sglang 0.5.30; unirl's SGLang clients are tested "
        "against sglang 0.5.23"
    ]
    with loopback({}) as server, caplog.at_level(logging.WARNING):
        caplog.clear()
        assert SGLangTextClient(base_url=server.url).check_version() is None
    assert "an unknown version (no /server_info version)" in caplog.records[0].getMessage()


# -- /update_weights_from_tensor -----------------------------------------------------------------------


def test_inline_update_body_is_what_the_released_deserializer_read() -> None:
    sent = cases.weight_update_tensors()
    with loopback(
        {
            ("POST", "/update_weights_from_tensor"): Route(
                answer=json_answer({"success": True, "message": "ok"})
            )
        }
    ) as server:
        out = SGLangHttpClient(base_url=server.url).update_weights_from_tensor(
            sent, target_modules=["transformer"], serialization="inline"
        )
    assert out == {"success": True, "message": "ok"}
    (body,) = server.bodies("/update_weights_from_tensor")
    assert sorted(body) == UPDATE["sent_keys"] and set(body) <= set(UPDATE["request_fields"])
    payload = body["serialized_named_tensors"][0]
    # the pickle asks for exactly the globals the released SafeUnpickler resolved when it
    # rebuilt the recorder's payload (made by the same update_weights_body) bit for bit
    resolved: set[str] = set()

    class Noting(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            resolved.add(f"{module}.{name}")
            return super().find_class(module, name)

    got = Noting(io.BytesIO(base64.b64decode(payload, validate=True))).load()
    assert sorted(resolved) == UPDATE["resolved_globals"]
    assert [n for n, _ in got] == [n for n, _ in sent]
    assert all(
        torch.equal(a, b) and a.dtype == b.dtype for (_, a), (_, b) in zip(got, sent, strict=True)
    )
    released = UPDATE["deserialized"]
    assert [r["name"] for r in released] == [n for n, _ in sent]
    assert all(r["equal_to_sent"] and r["device"] == "cpu" for r in released)
    assert [r["sha256"] for r in released] == [sha256_like_sglang(t) for _, t in sent]


def test_engine_sync_posts_inline_tensors_and_asks_the_checker() -> None:
    """The ``tensor`` transport's last hop: each bucket inline, then one SHA-256 check."""
    sent = dict(cases.weight_update_tensors())
    held: dict[str, torch.Tensor] = {}  # what the "server" loaded from the posted payloads

    def update(body: bytes) -> tuple[int, str, bytes]:
        (payload,) = json.loads(body)["serialized_named_tensors"]
        # our own payload (trusted here); test_inline_update_body... pins the released reading
        held.update(dict(pickle.loads(base64.b64decode(payload))))
        return json_answer({"success": True, "message": "ok"})

    def checker(body: bytes) -> tuple[int, str, bytes]:
        expected = json.loads(body)["expected_named_tensors_sha256"]
        ok = expected == {n: sha256_like_sglang(t) for n, t in held.items()}
        return json_answer(
            {"success": ok, "message": "verified" if ok else "mismatch"}, 200 if ok else 400
        )

    routes = {
        INFO: info(),
        ("POST", "/update_weights_from_tensor"): Route(answer=update),
        ("POST", "/update_weights_from_tensor_checker"): Route(answer=checker),
    }
    manifest = SyncManifest(
        kind="full",
        entries=tuple(
            TensorMeta(
                name=n, source=n, shape=tuple(t.shape), dtype=str(t.dtype), wire_dtype=str(t.dtype)
            )
            for n, t in sent.items()
        ),
    )
    # one tensor per bucket: two posts, then one check
    buckets = plan_buckets(manifest.entries, 16)
    boxes = [encode_bucket(b, sent, index=i, total=len(buckets)) for i, b in enumerate(buckets)]
    with loopback(routes) as server:
        engine = SGLangEngine(
            model_path="m", family=SD3, server_url=server.url, launch=False, dtype="bf16"
        )
        engine.prepare_sync(manifest)
        with pytest.raises(WeightSyncError, match="fails its SHA-256"):
            engine.receive_tensor_buckets([boxes[0][:-1] + b"x", boxes[1]], manifest)
        report = engine.receive_tensor_buckets(boxes, manifest)
    posts = server.bodies("/update_weights_from_tensor")
    assert len(posts) == 2 and all(p["target_modules"] == ["transformer"] for p in posts)
    assert [len(server.bodies("/update_weights_from_tensor_checker"))] == [1]
    as_engine = {n: t.to(torch.bfloat16) for n, t in sent.items()}
    assert report["checksums"] == {n: tensor_checksum(t) for n, t in as_engine.items()}
    assert report["num_tensors"] == 2


# -- /generate (language-model server) ------------------------------------------------------------


def test_text_client_and_engine_read_the_released_generate_answer() -> None:
    with loopback(
        {("POST", "/generate"): Route(answer=(200, "application/json", GENERATE)), INFO: info()}
    ) as server:
        client = SGLangTextClient(base_url=server.url)
        outs = client.generate(cases.LLM_PROMPTS, [{"max_new_tokens": 5}] * 2)
        engine = SGLangLLMEngine(
            model_path="tiny",
            bundle={"_target_": "unirl.models.qwen3.Qwen3Bundle", "path": "tiny", "dtype": "fp32"},
            server_url=server.url,
            launch=False,
            dtype="fp32",
        )
        completions = [engine._completion(o, i) for i, o in enumerate(outs)]
        req = RolloutReq(
            sample_ids=torch.tensor([0, 1]),
            group_ids=torch.tensor([0, 0]),
            primitives={"text": Texts(texts=["What is 3 + 4?", "What is 2 * 5?"])},
            stage_params={
                "text": TextRequest(
                    seed_ids=torch.tensor([0, 1]), max_new_tokens=5, temperature=1.0
                )
            },
            seed=5,
        )
        track = engine.generate(req).tracks["text"]
    (body,) = server.bodies("/generate")[:1]
    assert body["input_ids"] == cases.LLM_PROMPTS and body["return_logprob"] is True
    assert [c.tokens for c in completions] == cases.LLM_OUTPUTS
    assert [c.finish_reason for c in completions] == ["stop", "length"]
    for i, c in enumerate(completions):
        assert c.log_probs.tolist() == cases.llm_log_probs(i)
    seg = track.segment
    for i in range(2):
        mask = seg.loss_mask.row(i)
        assert seg.tokens.row(i)[mask].tolist() == cases.LLM_OUTPUTS[i]
        assert seg.log_probs.row(i)[mask].tolist() == cases.llm_log_probs(i)


# -- the recorder itself, where the released package is installed -------------------------------------


@pytest.mark.skipif(
    not os.environ.get("UNIRL_SGLANG_PYTHON"),
    reason="set UNIRL_SGLANG_PYTHON to a python with sglang==0.5.23 (see docs/engines.md) to re-record",
)
def test_recorder_reproduces_the_committed_fixtures() -> None:
    script = Path(cases.FIXTURES) / "record_sglang.py"
    out = subprocess.run(
        [os.environ["UNIRL_SGLANG_PYTHON"], str(script), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert out.stdout.count("same: ") == 3, out.stdout
