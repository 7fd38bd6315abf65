"""HTTP client of an SGLang language-model server (``python -m sglang.launch_server``),
written against its native routes:

- ``POST /generate`` — a batch of ``input_ids`` with per-sample ``sampling_params``;
  ``return_logprob`` gives ``meta_info.output_token_logprobs`` (``[logprob, token id, text]``
  per generated token) and ``meta_info.finish_reason`` (``{"type": "stop" | "length" |
  "abort", ...}``);
- ``POST /update_weights_from_tensor`` — ``serialized_named_tensors`` (one payload per
  tensor-parallel rank, SGLang's ``MultiprocessingSerializer``: CUDA tensors travel as IPC
  handles, so the server must share the GPU) and ``flush_cache``;
- ``POST /get_weights_by_name`` — the first ``truncate_size`` values of a parameter
  (read-back check after a sync);
- ``POST /load_lora_adapter`` / ``/unload_lora_adapter`` — a peft adapter folder loaded under
  a name that ``/generate`` then selects per request (``lora_path``; the server runs with
  ``--enable-lora``);
- ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` — sleep / wake (the
  server runs with ``--enable-memory-saver``).

Pinned to sglang 0.5.23's wire format (``SUPPORTED_SGLANG_VERSIONS``, checked against
``GET /server_info`` when the engine connects): ``tests/rollout/test_sglang_released.py`` feeds
this class, over a real loopback HTTP server, a ``/generate`` answer made by the released
package's own code (``tests/fixtures/engines/record_sglang.py``). No GPU run of a real server
was possible where this was written.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import torch

from unirl.rollout.engine.sglang_server import SGLangServerClient, wait_until_healthy

INSTALL_HINT = "pip install 'unirl-mm[sglang]' (or sglang itself: pip install sglang)"


def require_sglang_runtime() -> Any:
    """Import SGLang's language-model runtime or fail naming the install."""
    try:
        import sglang.srt
    except ImportError as exc:
        raise ImportError(
            f"the sglang text engine needs SGLang's runtime (sglang.srt): {INSTALL_HINT} "
            f"(import failed: {exc})"
        ) from exc
    import sglang

    return sglang


class SGLangTextClient(SGLangServerClient):
    """Talks to one language-model server at ``base_url`` (e.g. ``http://127.0.0.1:30000``);
    an error keeps the first 500 characters of a non-JSON answer. Needs only httpx; sglang
    itself for ``update_weights_from_tensor`` (its serializer makes the CUDA IPC payload)."""

    error_text_chars = 500

    def generate(
        self,
        input_ids: list[list[int]],
        sampling_params: list[dict[str, Any]],
        *,
        texts: list[str] | None = None,
        image_data: list[str] | None = None,
        lora_path: str | None = None,
    ) -> list[dict[str, Any]]:
        """One output dict per prompt (``output_ids``, ``meta_info``). With ``image_data``
        (base64 PNGs, one per prompt) the server reads ``texts`` (its processor expands the
        image placeholder) instead of ``input_ids``."""
        body: dict[str, Any] = {
            "sampling_params": sampling_params,
            "return_logprob": True,
            "logprob_start_len": -1,  # generated tokens only
        }
        if image_data is not None:
            body.update({"text": texts, "image_data": image_data})
        else:
            body["input_ids"] = input_ids
        if lora_path is not None:
            body["lora_path"] = [lora_path] * len(sampling_params)
        out = self._post("/generate", body)
        return out if isinstance(out, list) else [out]

    def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        return dict(self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path}))

    def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        return dict(self._post("/unload_lora_adapter", {"lora_name": name}))

    def update_weights_from_tensor(
        self, named_tensors: list[tuple[str, torch.Tensor]], *, tp_size: int = 1
    ) -> dict[str, Any]:
        require_sglang_runtime()
        from sglang.srt.utils import MultiprocessingSerializer

        payload = MultiprocessingSerializer.serialize(named_tensors, output_str=True)
        return dict(
            self._post(
                "/update_weights_from_tensor",
                {"serialized_named_tensors": [payload] * tp_size, "flush_cache": True},
            )
        )

    def get_weights_by_name(self, name: str, truncate_size: int) -> Any:
        return self._post("/get_weights_by_name", {"name": name, "truncate_size": truncate_size})


def launch_text_server(
    *, model_path: str, port: int, args: list[str], startup_timeout_s: float
) -> subprocess.Popen[bytes]:
    """``python -m sglang.launch_server --model-path ... --port ...`` as a child process;
    returns once ``/health`` answers (a server that exits or stays silent is an error)."""
    require_sglang_runtime()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    proc = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port), *args])
    return wait_until_healthy(
        proc,
        port=port,
        startup_timeout_s=startup_timeout_s,
        server="sglang.launch_server",
        model_path=model_path,
    )
