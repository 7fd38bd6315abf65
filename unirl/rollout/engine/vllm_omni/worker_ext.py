"""``UnirlWorkerExtension``: weight sync inside vLLM-Omni's diffusion worker processes.

vLLM-Omni 0.30 builds each diffusion worker through ``WorkerWrapperBase``, which, given
``worker_extension_cls`` (a qualified name: ``Omni(model=..., worker_extension_cls=
"unirl.rollout.engine.vllm_omni.worker_ext.UnirlWorkerExtension")``), makes the worker class
``type(..., (UnirlWorkerExtension, DiffusionWorker), {})``; ``collective_rpc(method, args=...)``
then reaches these methods on every worker through ``WorkerWrapperBase.execute_method``. The
synchronous ``Omni`` exposes that RPC on its ``engine`` (``Omni.engine.collective_rpc``);
``AsyncOmni`` as ``collective_rpc`` itself.

Methods (the names ``OmniBackend`` calls; none exists on vLLM-Omni's own worker):

- ``update_weights(named_tensors, kind, lora_config)``: copy ``[(name, tensor)]`` into the
  pipeline's ``transformer`` (``kind="full"``: its parameters; ``"lora"``: a peft adapter equal
  to the trainer's, injected on the first call) — CPU tensors or tensors of any device;
- ``update_weights_ipc(payload, kind, lora_config)``: the same from CUDA IPC handles
  (``weight_sync.ipc.IpcPayload``, opened in this worker process);
- ``weight_checksums(names)``: bit-exact read-back (``weight_sync.tensor_checksum``).

Sleep and wake are vLLM-Omni's own worker methods (``sleep(level)``, ``wake_up(tags)``),
reached through the same RPC. Everything here runs in the worker process, where torch and
peft are present; this module imports nothing of vLLM-Omni.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from unirl.distributed.weight_sync.ipc import IpcPayload, open_ipc_payload
from unirl.distributed.weight_sync.manifest import SyncManifest, TensorMeta, WeightSyncError
from unirl.distributed.weight_sync.receiver import ModuleReceiver

QUALNAME = "unirl.rollout.engine.vllm_omni.worker_ext.UnirlWorkerExtension"


class UnirlWorkerExtension:
    """Mixed into vLLM-Omni's ``DiffusionWorker`` (first in the MRO). ``unirl_target``: the
    pipeline attribute the syncs update (the trained module)."""

    unirl_target: ClassVar[str] = "transformer"

    def _unirl_module(self) -> nn.Module:
        runner = getattr(self, "model_runner", None)
        pipeline = getattr(runner, "pipeline", None)
        if pipeline is None:
            raise WeightSyncError(
                "vLLM-Omni worker: no pipeline is loaded (model_runner.pipeline is None); wake the "
                "engine before a weight sync"
            )
        module = getattr(pipeline, self.unirl_target, None)
        if not isinstance(module, nn.Module):
            raise WeightSyncError(
                f"vLLM-Omni worker: the pipeline {type(pipeline).__name__} has no module "
                f"{self.unirl_target!r} to update"
            )
        return module

    def _unirl_receiver(self) -> ModuleReceiver:
        receiver = getattr(self, "_unirl_module_receiver", None)
        if receiver is None:
            rank = getattr(self, "rank", "?")
            receiver = ModuleReceiver(self._unirl_module, where=f"vLLM-Omni worker rank {rank}")
            self._unirl_module_receiver = receiver
        return receiver

    def _unirl_manifest(
        self, named: list[tuple[str, torch.Tensor]], kind: str, lora_config: dict[str, Any] | None
    ) -> SyncManifest:
        entries = tuple(
            TensorMeta(
                name=n, source=n, shape=tuple(t.shape), dtype=str(t.dtype), wire_dtype=str(t.dtype)
            )
            for n, t in named
        )
        return SyncManifest(kind=kind, entries=entries, lora_config=lora_config)

    @torch.no_grad()
    def update_weights(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        kind: str,
        lora_config: dict[str, Any] | None,
    ) -> int:
        """Copy ``named_tensors`` into the target module; returns the bytes received. Names,
        shapes and dtypes are checked against the module first (``check_manifest``)."""
        receiver = self._unirl_receiver()
        manifest = self._unirl_manifest(named_tensors, kind, lora_config)
        receiver.prepare(manifest)
        return receiver.apply(manifest, dict(named_tensors))

    def update_weights_ipc(
        self, payload: IpcPayload, kind: str, lora_config: dict[str, Any] | None
    ) -> int:
        """Open the trainer's CUDA IPC handles in this worker and copy from them."""
        tensors = open_ipc_payload(payload)
        return self.update_weights(list(tensors.items()), kind, lora_config)

    def weight_checksums(self, names: list[str]) -> dict[str, int]:
        """Bit-exact checksums of the live tensors ``names`` (LoRA names once injected)."""
        receiver = self._unirl_receiver()
        kind = "lora" if receiver.lora_config is not None else "full"
        got = receiver.checksums(kind, names)
        missing = [n for n in names if n not in got]
        if missing:
            raise WeightSyncError(
                f"vLLM-Omni worker: no tensor named {missing[:5]} in {self.unirl_target}"
            )
        return got


__all__ = ["QUALNAME", "UnirlWorkerExtension"]
