"""``CudaIpcSync``: same-node, same-GPU hand-over of CUDA tensors to *another process*.

The sender wraps each gathered CUDA tensor in a CUDA IPC handle
(``torch.multiprocessing.reductions.reduce_tensor``); only the small handles travel, and the
receiving process maps the trainer's memory and copies from it. This is the path to an
inference server that runs as its own process on the trainer's GPU (an SGLang / vLLM-Omni
server colocated with training). Our own dedicated engine lives *inside* the trainer's
process, where IPC is impossible and pointless: it rejects an IPC payload and asks for
``transport=local``. GPU-only: on CPU every entry point raises a clear error.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from unirl.config.require import require
from unirl.distributed.weight_sync.base import SyncBackend, WeightSync
from unirl.distributed.weight_sync.manifest import WeightSyncError


class CudaIpcSync(WeightSync):
    """Weight sync through CUDA IPC handles; ``layout=colocate`` on CUDA only.

    ``payload``: ``auto`` (the LoRA adapter when the backend trains one, else the full
    trainable parameters), ``lora`` or ``full``.
    """

    allowed_transports: ClassVar[tuple[str, ...]] = ("cuda_ipc",)
    default_transport: ClassVar[dict[str, str]] = {"colocate": "cuda_ipc", "separate": "cuda_ipc"}

    def __init__(self, *, payload: str = "auto", **kwargs: Any) -> None:
        require(
            payload in ("auto", "lora", "full"),
            f"sync.payload must be auto, lora or full, got {payload!r}",
        )
        super().__init__(**kwargs)
        self.payload = payload
        # resolved against the backend: this sync sets its kind per instance
        self.kind = "full" if payload == "auto" else payload  # type: ignore[misc]

    def transport_for(self, layout: str) -> str:
        require(
            layout == "colocate",
            "CudaIpcSync hands GPU memory to another process on the same GPU, so it needs "
            "layout=colocate; use FullSync (collective) or LoraSync (object_store) with layout=separate",
        )
        return "cuda_ipc"

    fixed_kind: ClassVar[bool] = False  # payload=auto follows what the backend trains

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        backend = getattr(recipe, "backend", None)
        payload = block.get("payload", "auto")
        if isinstance(backend, Mapping) and payload in ("lora", "full"):
            cls.check_trained(payload, cls.__name__, backend.get("lora") is not None)

    def check_backend(self, backend: SyncBackend) -> None:
        if self.payload == "auto":
            self.kind = "lora" if getattr(backend, "has_lora", False) else "full"  # type: ignore[misc]
        super().check_backend(backend)
        device = torch.device(getattr(backend, "device", "cpu"))
        require(
            device.type == "cuda",
            f"CudaIpcSync needs the trainer on CUDA (backend.device is {device}); CUDA IPC cannot run on "
            "CPU — use FullSync or LoraSync (transport local / object_store / collective)",
        )


@dataclass(frozen=True, kw_only=True)
class IpcPayload:
    """CUDA IPC handles of named tensors plus where they were made (pid, host)."""

    pid: int
    host: str
    # (name, rebuild function, its args)
    handles: tuple[tuple[str, Callable[..., torch.Tensor], tuple[object, ...]], ...]


def build_ipc_payload(tensors: dict[str, torch.Tensor]) -> IpcPayload:
    """Handles for ``tensors`` (all CUDA). The caller keeps the tensors alive until the
    receiver has copied them."""
    not_cuda = [n for n, t in tensors.items() if t.device.type != "cuda"]
    if not_cuda:
        raise WeightSyncError(
            f"CudaIpcSync: {len(not_cuda)} tensor(s) are not on a CUDA device (e.g. {not_cuda[0]}); "
            "CUDA IPC needs GPU tensors — on CPU use FullSync / LoraSync"
        )
    from torch.multiprocessing.reductions import reduce_tensor

    handles = []
    for name, t in tensors.items():
        rebuild, args = reduce_tensor(t.detach().contiguous())
        handles.append((name, rebuild, tuple(args)))
    return IpcPayload(pid=os.getpid(), host=socket.gethostname(), handles=tuple(handles))


def open_ipc_payload(payload: IpcPayload) -> dict[str, torch.Tensor]:
    """Map the sender's tensors into this process (views of the sender's memory: copy them
    before returning control to the sender)."""
    if payload.pid == os.getpid():
        raise WeightSyncError(
            "CudaIpcSync: the receiver runs in the sender's own process (a colocated dedicated engine "
            "shares the trainer's worker), where CUDA IPC cannot open the handles; use FullSync or "
            "LoraSync with transport=local for in-process hand-over"
        )
    if payload.host != socket.gethostname():
        raise WeightSyncError(
            f"CudaIpcSync: handles made on host {payload.host!r} cannot be opened on "
            f"{socket.gethostname()!r}; CUDA IPC works within one node only"
        )
    if not torch.cuda.is_available():
        raise WeightSyncError(
            "CudaIpcSync: this process sees no CUDA device; CUDA IPC cannot run on CPU"
        )
    return {name: rebuild(*args) for name, rebuild, args in payload.handles}
