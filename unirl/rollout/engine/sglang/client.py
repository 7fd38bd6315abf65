"""HTTP client of an SGLang diffusion server (``sglang serve``), written against the routes of
``sglang.multimodal_gen`` as released in sglang 0.5.23 (``SUPPORTED_SGLANG_VERSIONS``):

- ``GET /server_info`` — ``version``, checked once when the client connects;
- ``POST /rollout/generate`` — one prompt, ``num_outputs_per_prompt`` samples, SDE rollout with
  per-step log-probs (``rollout_log_probs``), the dense DiT trajectory (``dit_trajectory``:
  ``latents [T+1, ...]``, ``sigmas [T+1]``) and the denoising env (encoded conditions). The
  answer is msgpack (``application/msgpack``); every tensor is a map ``{"__tensor__": true,
  "data": <safetensors bytes of {"t": tensor}>, "shape": [...], "dtype": "torch.float32"}``
  with ``data`` as msgpack *bin* (raw bytes, not base64 text);
- ``POST /update_weights_from_tensor`` — ``serialized_named_tensors`` read by SGLang's
  ``MultiprocessingSerializer.deserialize`` (base64 text of a pickle that its restricted
  unpickler accepts): ``serialization="ipc"`` pickles with SGLang's own serializer (CUDA
  tensors as IPC handles: same node only), ``"inline"`` pickles CPU tensors with their bytes
  (any node: the ``tensor`` sync transport);
- ``POST /update_weights_from_tensor_checker`` — per-tensor SHA-256 read-back check;
- ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` — sleep / wake.

The decoding and the request bodies are tested against bytes made by the released package's
own code (``tests/fixtures/engines/record_sglang.py``) through a real loopback HTTP server.
"""

from __future__ import annotations

import base64
import hashlib
import io
import pickle
import subprocess
from typing import Any, Literal

import torch

from unirl.rollout.engine.sglang_server import SGLangServerClient, wait_until_healthy

EXTRA_HINT = "pip install 'unirl-mm[sglang]'"
Serialization = Literal["ipc", "inline"]


class SGLangWireError(ValueError):
    """An answer of the server that is not in the encoding of the supported versions."""


def require_sglang() -> Any:
    """Import sglang's diffusion runtime or fail naming the extra."""
    try:
        import sglang
        from sglang.multimodal_gen.runtime.entrypoints.post_training import io_struct  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the sglang rollout engine needs SGLang's diffusion runtime (sglang.multimodal_gen): {EXTRA_HINT} "
            f"(import failed: {exc})"
        ) from exc
    import sglang

    return sglang


def tensor_from_wire(obj: dict[str, Any]) -> torch.Tensor:
    """One ``{"__tensor__": true, "data": bytes, "shape", "dtype"}`` map -> the tensor; the
    shape and dtype the server states must match what the safetensors bytes hold."""
    data = obj.get("data")
    if isinstance(data, str):
        raise SGLangWireError(
            "sglang: a tensor arrived as text (base64?); sglang 0.5.23 sends safetensors bytes as "
            "msgpack bin — this server speaks another encoding (check its version)"
        )
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SGLangWireError(f"sglang: tensor data is {type(data).__name__}, expected bytes")
    from safetensors.torch import load

    loaded = load(bytes(data))
    if list(loaded) != ["t"]:
        raise SGLangWireError(f"sglang: a tensor payload holds {sorted(loaded)}, expected ['t']")
    t = loaded["t"]
    shape, dtype = obj.get("shape"), obj.get("dtype")
    if shape is not None and [int(s) for s in shape] != list(t.shape):
        raise SGLangWireError(f"sglang: tensor says shape {shape}, its bytes hold {list(t.shape)}")
    if dtype is not None and str(dtype) != str(t.dtype):
        raise SGLangWireError(f"sglang: tensor says dtype {dtype}, its bytes hold {t.dtype}")
    return t


def decode_tensors(obj: Any) -> Any:
    """Undo the server's tensor encoding (safetensors-bytes maps) recursively."""
    if isinstance(obj, dict):
        if obj.get("__tensor__") is True:
            return tensor_from_wire(obj)
        return {k: decode_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [decode_tensors(v) for v in obj]
    return obj


def decode_rollout_body(content: bytes, content_type: str) -> list[dict[str, Any]]:
    """The per-sample dicts of a ``/rollout/generate`` answer, tensors decoded."""
    if "msgpack" not in content_type:
        raise SGLangWireError(
            f"sglang /rollout/generate answered {content_type or 'no content type'}, expected "
            "application/msgpack (sglang 0.5.23)"
        )
    import msgpack

    samples = msgpack.unpackb(content, raw=False)
    if not isinstance(samples, list):
        raise SGLangWireError(
            f"sglang /rollout/generate answered a {type(samples).__name__}, expected a list of samples"
        )
    return [decode_tensors(s) for s in samples]


def sha256_like_sglang(t: torch.Tensor) -> str:
    """SHA-256 of dtype, shape and raw bytes, as the server's update checker computes it."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256()
    h.update(str(t.dtype).encode("utf-8"))
    h.update(repr(tuple(t.shape)).encode("utf-8"))
    h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def inline_payload(named_tensors: list[tuple[str, torch.Tensor]]) -> str:
    """Base64 text of a plain pickle of ``[(name, CPU tensor)]``: the tensors' bytes travel in
    the payload (torch pickles a CPU storage by value), which SGLang's restricted unpickler
    rebuilds on any node."""
    buf = io.BytesIO()
    cpu = [(name, t.detach().to("cpu").contiguous()) for name, t in named_tensors]
    pickle.dump(cpu, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def update_weights_body(
    named_tensors: list[tuple[str, torch.Tensor]],
    *,
    target_modules: list[str],
    serialization: Serialization,
    weight_update_mode: str | None = None,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
) -> dict[str, Any]:
    """The JSON body of ``/update_weights_from_tensor`` (``UpdateWeightFromTensorReqInput``)."""
    if serialization == "ipc":
        from sglang.srt.utils import MultiprocessingSerializer

        payload = MultiprocessingSerializer.serialize(named_tensors, output_str=True)
    elif serialization == "inline":
        payload = inline_payload(named_tensors)
    else:
        raise ValueError(f"serialization must be ipc or inline, got {serialization!r}")
    body: dict[str, Any] = {"serialized_named_tensors": [payload], "target_modules": target_modules}
    if weight_update_mode is not None:
        body.update(
            {
                "weight_update_mode": weight_update_mode,
                "lora_rank": lora_rank,
                "lora_alpha": lora_alpha,
            }
        )
    return body


class SGLangHttpClient(SGLangServerClient):
    """Talks to one diffusion server at ``base_url`` (e.g. ``http://127.0.0.1:30000``). Needs
    httpx, msgpack and safetensors; sglang itself only for ``serialization="ipc"`` updates."""

    def health(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except Exception:
            return False

    def rollout_generate(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        resp = self.http.post("/rollout/generate", json=payload)
        if resp.status_code >= 400:
            raise RuntimeError(
                f"SGLang /rollout/generate -> HTTP {resp.status_code}: {resp.text[:500]}"
            )
        return decode_rollout_body(resp.content, resp.headers.get("content-type", ""))

    def update_weights_from_tensor(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        *,
        target_modules: list[str],
        weight_update_mode: str | None = None,
        lora_rank: int | None = None,
        lora_alpha: float | None = None,
        serialization: Serialization = "ipc",
    ) -> dict[str, Any]:
        body = update_weights_body(
            named_tensors,
            target_modules=target_modules,
            serialization=serialization,
            weight_update_mode=weight_update_mode,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
        )
        return dict(self._post("/update_weights_from_tensor", body))

    def check_weights(self, target_module: str, expected_sha256: dict[str, str]) -> dict[str, Any]:
        return dict(
            self._post(
                "/update_weights_from_tensor_checker",
                {"target_module": target_module, "expected_named_tensors_sha256": expected_sha256},
            )
        )


def launch_server(
    *, model_path: str, port: int, args: list[str], startup_timeout_s: float
) -> subprocess.Popen[bytes]:
    """``sglang serve --model-path ... --port ...`` as a child process; returns once /health answers."""
    require_sglang()
    proc = subprocess.Popen(
        ["sglang", "serve", "--model-path", model_path, "--port", str(port), *args]
    )
    return wait_until_healthy(
        proc,
        port=port,
        startup_timeout_s=startup_timeout_s,
        server="sglang serve",
        model_path=model_path,
    )
