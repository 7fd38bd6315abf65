"""``SGLangLLMEngine``: the text rollout contract on top of an SGLang language-model server.

One server per rollout worker (launched as a child process, or reached at ``server_url``).
Prompts are formatted and tokenized here exactly as the trained bundle does (its
``PromptFormatter``, built from the recipe's bundle block without weights) and sent as
``input_ids`` (a vision-language family's prompts go as text with their image, which the
server's processor expands the same way); every sample carries its own ``sampling_seed``
derived from ``(seed, sample id)``. The server's generated ids and per-token log-probs become
the same ``TextSegment`` the trainside pipeline records (``models.common_ar.track.text_track``).
Full-weight syncs go to ``/update_weights_from_tensor`` and a few parameters are read back
(``/get_weights_by_name``); LoRA syncs write the adapter as a peft folder, load it under a new
name (``/load_lora_adapter``), select it for every later request and unload the previous one.
"""

from __future__ import annotations

import base64
import io
import shutil
import time
from collections.abc import Mapping
from typing import Any

import torch

from unirl.config.precision import parse_dtype
from unirl.config.require import ConfigError, require
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.weight_sync.checksum import tensor_checksum
from unirl.distributed.weight_sync.group import free_port
from unirl.distributed.weight_sync.manifest import SyncManifest, WeightSyncError
from unirl.distributed.weight_sync.receiver import WeightReceiver
from unirl.models.common_ar.generate import LENGTH, STOP, Completion
from unirl.models.common_ar.track import text_track
from unirl.rollout.engine.dedicated.engine import plain_block
from unirl.rollout.engine.sglang_server import ServerSleep
from unirl.types import RolloutReq, RolloutResp, TextRequest, noise_seed


def png_base64(pixels: torch.Tensor) -> str:
    """An image ``[3, H, W]`` in [0, 1] as a base64 PNG (what SGLang's ``image_data`` takes)."""
    from PIL import Image

    array = (pixels.detach().float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu()
    buffer = io.BytesIO()
    Image.fromarray(array.numpy()).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class EngineContractError(RuntimeError):
    """The server answered something the text contract cannot hold."""


def _family(block: Any) -> Any:
    from unirl.config.validate import locate

    block = plain_block(block)
    if not isinstance(block, Mapping) or "_target_" not in block:
        raise ConfigError(
            "rollout.bundle: give the recipe's bundle block (bundle: ${bundle}) with "
            "rollout._recursive_: false, so the engine reads its prompt knobs and loads no weights"
        )
    family = locate(str(block["_target_"]), "rollout.bundle")
    require(
        callable(getattr(family, "prompt_formatter", None)),
        f"rollout.bundle._target_={block['_target_']} is not a causal-LM bundle (no "
        "prompt_formatter); the SGLang text engine serves unirl.models.common_ar families",
    )
    return family


class SGLangLLMEngine(ServerSleep, WeightReceiver):
    """Rollout through SGLang's language-model server.

    ``model_path``: what the server loads (the bundle's path; a hub id or a folder).
    ``bundle``: the recipe's bundle block (``${bundle}``, with ``_recursive_: false`` on this
    block) — its class and prompt knobs tokenize the prompts. ``server_url``: use a running
    server (``launch=false``). ``server_args``: extra ``launch_server`` flags (for sleep / wake
    ``--enable-memory-saver``; for per-sample seeds to be honoured bit for bit
    ``--enable-deterministic-inference``). ``dtype``: the server's weight dtype (syncs cast to
    it). ``tp_size``: tensor-parallel ranks of the server (one serialized payload each).
    ``check_names``: parameters read back after every full sync (the first ``check_values``
    of each). ``adapter_dir``: where LoRA syncs write the adapter folders the server loads
    (default: a temporary folder on this node). ``client``: a ready client (tests inject a
    fake); when omitted, a launched server needs sglang installed. ``track_name``: the response track the
    completions fill (``text``; a prompt enhancer's policy track). ``request_timeout_s``: the
    HTTP timeout (s) of each request to the server; ``startup_timeout_s``: how long a
    launched server may take to answer ``/health``. ``strict_version``: refuse a server whose
    ``/server_info`` version is not one of ``SUPPORTED_SGLANG_VERSIONS`` (default: one warning
    line naming both).
    """

    engine_kind = "sglang"
    success_if_unsaid = True  # its memory routes may answer without a `success` key

    @classmethod
    def check_config(cls, block: dict[str, Any], recipe: Any) -> None:
        """Before Ray: a bundle block of a causal-LM family, not instantiated by Hydra."""
        _family(block.get("bundle"))
        require(
            block.get("_recursive_") is False,
            "rollout._recursive_ must be false for the SGLang text engine: otherwise Hydra "
            "builds rollout.bundle (the whole model) inside the engine",
        )
        sync = getattr(recipe, "sync", None) or {}
        target = str(sync.get("_target_", ""))
        require(
            not target or target.endswith(("FullSync", "LoraSync")),
            f"sync._target_={target}: the SGLang text engine takes FullSync (full weights) or "
            "LoraSync (a peft adapter it loads by name)",
        )
        require(
            not sync.get("merged_lora"),
            "sync.merged_lora: merged LoRA syncs to SGLang are not built yet (the engine cannot "
            "merge an adapter into weights the server holds); set merged_lora: false to serve "
            "the adapter by name, or use FullSync",
        )
        args = [str(a) for a in block.get("server_args") or []]
        require(
            not target.endswith("LoraSync")
            or not block.get("launch", True)
            or "--enable-lora" in args,
            "rollout.server_args: a LoRA run needs the server started with --enable-lora (and "
            "--max-lora-rank <r>, --lora-target-modules <the trained targets>)",
        )

    def __init__(
        self,
        *,
        model_path: str,
        bundle: Any,
        server_url: str | None = None,
        launch: bool = True,
        server_args: list[str] | None = None,
        dtype: str = "bf16",
        tp_size: int = 1,
        track_name: str = "text",
        check_names: list[str] | None = None,
        check_values: int = 64,
        adapter_dir: str | None = None,
        request_timeout_s: float = 1800.0,
        startup_timeout_s: float = 900.0,
        strict_version: bool = False,
        client: Any = None,
    ) -> None:
        require(tp_size >= 1, f"rollout.tp_size must be >= 1, got {tp_size}")
        require(
            server_url is not None or launch or client is not None,
            "rollout: set server_url or launch=true",
        )
        bundle = plain_block(bundle)
        self.formatter = _family(bundle).prompt_formatter(bundle)
        self.model_path = model_path
        self.dtype = parse_dtype(dtype, "rollout.dtype")
        self.tp_size = int(tp_size)
        self.track_name = track_name
        self.check_names = list(
            check_names if check_names is not None else ["model.embed_tokens.weight"]
        )
        self.check_values = int(check_values)
        self.adapter_dir = adapter_dir
        self.lora_name: str | None = None  # the adapter every request uses (LoRA syncs)
        self.lora_version = 0
        self.process = None
        if client is None:
            from unirl.rollout.engine.sglang_llm.client import (
                SGLangTextClient,
                launch_text_server,
            )

            if server_url is None:
                port = free_port()
                self.process = launch_text_server(
                    model_path=model_path,
                    port=port,
                    args=list(server_args or []),
                    startup_timeout_s=startup_timeout_s,
                )
                server_url = f"http://127.0.0.1:{port}"
            client = SGLangTextClient(base_url=server_url, timeout_s=request_timeout_s)
            client.check_version(strict=strict_version)
        self.client = client
        self.asleep = False

    @property
    def response_prefix(self) -> str:
        """The bundle's prefilled assistant text (``response_prefix``): the head of every
        decoded completion; a composed engine strips it from the rewrite it draws."""
        return str(self.formatter.response_prefix)

    # -- sampling ----------------------------------------------------------------------------------

    def _sampling_params(self, block: TextRequest, seed: int, seed_id: int) -> dict[str, Any]:
        return {
            "max_new_tokens": block.max_new_tokens,
            "temperature": block.temperature,
            "top_p": block.top_p,
            "top_k": block.top_k,
            "stop": list(block.stop) or None,
            "stop_token_ids": list(self.formatter.stop_token_ids),
            "no_stop_trim": True,  # a stop string stays in the completion, as trainside keeps it
            "skip_special_tokens": False,
            "sampling_seed": noise_seed(seed, seed_id, "tokens") % (2**31 - 1),
        }

    def _completion(self, out: Mapping[str, Any], index: int) -> Completion:
        meta = out.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs")
        if pairs is None:
            raise EngineContractError(
                f"sglang: sample {index} came back without meta_info.output_token_logprobs "
                "(return_logprob=true was sent)"
            )
        ids = [int(p[1]) for p in pairs]
        given = out.get("output_ids")
        if given is not None and [int(t) for t in given] != ids:
            raise EngineContractError(
                f"sglang: sample {index}: output_ids and the log-prob token ids disagree"
            )
        reason = meta.get("finish_reason") or {}
        kind = reason.get("type") if isinstance(reason, Mapping) else str(reason)
        if kind not in (STOP, LENGTH):
            raise EngineContractError(f"sglang: sample {index} finished with {reason!r}")
        logps = torch.tensor([float(p[0]) for p in pairs], dtype=torch.float32)
        if not ids or not torch.isfinite(logps).all():
            raise EngineContractError(
                f"sglang: sample {index} has {len(ids)} tokens / non-finite log-probs"
            )
        return Completion(tokens=ids, log_probs=logps, finish_reason=str(kind))

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """This rank's shard in one ``/generate`` batch, mapped into the text contract."""
        if self.asleep:
            raise RuntimeError(
                "SGLangLLMEngine.generate while asleep; the driver calls wake_up() first"
            )
        block = req.params_for(self.track_name, TextRequest)
        t0 = time.perf_counter()
        prompt_ids = self.formatter.encode_prompts(req.prompts)
        t_encode = time.perf_counter() - t0
        params = [self._sampling_params(block, req.seed, int(i)) for i in block.seed_ids.tolist()]
        images = req.primitives.get("image")
        extra: dict[str, Any] = {}
        if images is not None:  # a vision-language prompt: its text and image, server-processed
            extra["texts"] = [self.formatter.prompt_text(p) for p in req.prompts]
            extra["image_data"] = [png_base64(px) for px in images.pixels]  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        outputs = self.client.generate(prompt_ids, params, lora_path=self.lora_name, **extra)
        t_generate = time.perf_counter() - t0
        if len(outputs) != len(prompt_ids):
            raise EngineContractError(
                f"sglang: asked for {len(prompt_ids)} completions, got {len(outputs)}"
            )
        completions = [self._completion(o, i) for i, o in enumerate(outputs)]
        track = text_track(
            req, prompt_ids, completions, formatter=self.formatter, temperature=block.temperature
        )
        return RolloutResp(
            tracks={self.track_name: track},
            timings={"encode": t_encode, "generate": t_generate},
        )

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def fetch_decoded(self, track: Any) -> Any:
        """Nothing is parked here: the track came back whole."""
        return track

    # -- weight sync: the server holds the weights ------------------------------------------------

    def _sync_prepare(self, manifest: SyncManifest) -> dict[str, str]:
        """The server exposes no parameter table: it checks names when it loads them. Full
        weights are cast to the server's dtype; an adapter travels in fp32."""
        if manifest.kind == "lora":
            if manifest.merged_lora:
                raise WeightSyncError(
                    "SGLangLLMEngine serves adapters by name; it cannot merge (merged_lora)"
                )
            return {e.name: str(torch.float32) for e in manifest.entries}
        return {e.name: str(self.dtype) for e in manifest.entries}

    def _apply_synced(
        self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        if manifest.kind == "lora":
            return self._apply_adapter(manifest, tensors)
        named = [(e.name, tensors[e.name].to(self.dtype)) for e in manifest.entries]
        out = self.client.update_weights_from_tensor(named, tp_size=self.tp_size)
        if not out.get("success", False):
            raise WeightSyncError(
                f"sglang update_weights_from_tensor failed: {out.get('message', out)}"
            )
        sent = dict(named)
        for name in self.check_names:
            if name not in sent:
                continue
            want = sent[name].detach().float().cpu().reshape(-1)[: self.check_values]
            got = torch.tensor(
                self.client.get_weights_by_name(name, self.check_values), dtype=torch.float32
            ).reshape(-1)[: len(want)]
            if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=0):
                raise WeightSyncError(
                    f"sglang read-back of {name} differs from what was sent (first values "
                    f"{got[:4].tolist()} vs {want[:4].tolist()})"
                )
        received = sum(t.numel() * t.element_size() for _, t in named)
        checksums = {n: tensor_checksum(t) for n, t in named}  # what the server confirmed
        return {"bytes": received, "checksums": checksums}

    def _apply_adapter(
        self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        """Write the adapter as a peft folder, load it under a new name, use it from the next
        request on, unload the one before."""
        import json
        import tempfile
        from pathlib import Path

        from safetensors.torch import save_file

        lora = dict(manifest.lora_config or {})
        self.lora_version += 1
        root = Path(self.adapter_dir or tempfile.gettempdir()) / f"unirl_sglang_{id(self):x}"
        folder = root / f"v{self.lora_version:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        named = {
            e.name: tensors[e.name].detach().float().cpu().contiguous() for e in manifest.entries
        }
        save_file(
            {f"base_model.model.{n}": t for n, t in named.items()},
            str(folder / "adapter_model.safetensors"),
        )
        (folder / "adapter_config.json").write_text(
            json.dumps(
                {
                    "peft_type": "LORA",
                    "task_type": "CAUSAL_LM",
                    "base_model_name_or_path": self.model_path,
                    "r": int(lora["r"]),
                    "lora_alpha": float(lora["lora_alpha"]),
                    "target_modules": lora["target_modules"],
                    "use_rslora": bool(lora.get("use_rslora", False)),
                    "lora_dropout": 0.0,
                    "bias": "none",
                }
            )
        )
        name = f"unirl_v{self.lora_version}"
        out = self.client.load_lora_adapter(name, str(folder))
        if not out.get("success", False):
            raise WeightSyncError(f"sglang load_lora_adapter failed: {out.get('message', out)}")
        previous, self.lora_name = self.lora_name, name
        if previous is not None:
            self.client.unload_lora_adapter(previous)
            shutil.rmtree(root / f"v{self.lora_version - 1:06d}", ignore_errors=True)
        received = sum(t.numel() * t.element_size() for t in named.values())
        return {"bytes": received, "checksums": {n: tensor_checksum(t) for n, t in named.items()}}

    @distributed(dispatch=Dispatch.BROADCAST)
    def checksums(self, kind: str | None = None, names: list[str] | None = None) -> dict[str, int]:
        raise WeightSyncError(
            "SGLangLLMEngine cannot read whole weights back into unirl checksums; each sync is "
            "verified by reading parameters back through /get_weights_by_name instead"
        )

    def __del__(self) -> None:
        proc = getattr(self, "process", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
