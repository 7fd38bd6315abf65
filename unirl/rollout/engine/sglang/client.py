"""HTTP client of an SGLang diffusion server (``sglang serve``), written against the public
post-training routes of ``sglang.multimodal_gen``:

- ``POST /rollout/generate`` — one prompt, ``num_outputs_per_prompt`` samples, SDE rollout with
  per-step log-probs (``rollout_log_probs``), the dense DiT trajectory (``dit_trajectory``:
  ``latents [T+1, ...]``, ``sigmas [T+1]``) and the denoising env (encoded conditions);
  msgpack body, tensors as base64 safetensors (``{"__tensor__": true, "data": ...}``);
- ``POST /update_weights_from_tensor`` — ``serialized_named_tensors`` from SGLang's own
  ``MultiprocessingSerializer`` (CUDA IPC for GPU tensors: same node only);
- ``POST /update_weights_from_tensor_checker`` — per-tensor SHA-256 read-back check;
- ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` — sleep / wake.

Not run against a real server here (no GPU, and SGLang's diffusion runtime does not run on
CPU); the contract tests drive ``SGLangEngine`` with a fake of this class.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from typing import Any

import torch

from unirl.rollout.engine.sglang_server import SGLangServerClient, wait_until_healthy

EXTRA_HINT = "pip install 'unirl-mm[sglang]'"


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


def decode_tensors(obj: Any) -> Any:
    """Undo the server's tensor encoding (base64 safetensors dicts) recursively."""
    if isinstance(obj, dict):
        if obj.get("__tensor__"):
            from safetensors.torch import load

            return load(base64.b64decode(obj["data"]))["t"]
        return {k: decode_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [decode_tensors(v) for v in obj]
    return obj


def sha256_like_sglang(t: torch.Tensor) -> str:
    """SHA-256 of dtype, shape and raw bytes, as the server's update checker computes it."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256()
    h.update(str(t.dtype).encode("utf-8"))
    h.update(repr(tuple(t.shape)).encode("utf-8"))
    h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class SGLangHttpClient(SGLangServerClient):
    """Talks to one diffusion server at ``base_url`` (e.g. ``http://127.0.0.1:30000``)."""

    def __init__(
        self, *, base_url: str, timeout_s: float = 600.0, api_key: str | None = None
    ) -> None:
        require_sglang()
        super().__init__(base_url=base_url, timeout_s=timeout_s, api_key=api_key)

    def health(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except Exception:
            return False

    def rollout_generate(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        import msgspec

        resp = self.http.post("/rollout/generate", json=payload)
        if resp.status_code >= 400:
            raise RuntimeError(
                f"SGLang /rollout/generate -> HTTP {resp.status_code}: {resp.text[:500]}"
            )
        return decode_tensors(msgspec.msgpack.decode(resp.content))

    def update_weights_from_tensor(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        *,
        target_modules: list[str],
        weight_update_mode: str | None = None,
        lora_rank: int | None = None,
        lora_alpha: float | None = None,
    ) -> dict[str, Any]:
        from sglang.srt.utils import MultiprocessingSerializer

        payload = MultiprocessingSerializer.serialize(named_tensors, output_str=True)
        body: dict[str, Any] = {
            "serialized_named_tensors": [payload],
            "target_modules": target_modules,
        }
        if weight_update_mode is not None:
            body.update(
                {
                    "weight_update_mode": weight_update_mode,
                    "lora_rank": lora_rank,
                    "lora_alpha": lora_alpha,
                }
            )
        return self._post("/update_weights_from_tensor", body)

    def check_weights(self, target_module: str, expected_sha256: dict[str, str]) -> dict[str, Any]:
        return self._post(
            "/update_weights_from_tensor_checker",
            {"target_module": target_module, "expected_named_tensors_sha256": expected_sha256},
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
