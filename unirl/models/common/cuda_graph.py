"""A function of fixed-shape tensors replayed from CUDA graphs, one per input signature.

Small-batch passes of big frozen encoders (SD3's two CLIPs and T5-XXL over one or two
prompts per rollout) spend most of their wall time launching about 1,500 kernels, not
running them; a captured graph launches them as one. :class:`GraphedFunction` captures
``fn`` the first time it sees an input signature (shapes and dtypes) and replays that graph
afterwards: inputs are copied into the graph's static buffers, outputs are cloned out of
its static ones (the next replay overwrites them), and every graph shares one memory pool.

A graph holds the device addresses of the weights it read: whoever moves those weights
(offload to CPU, ``.to(device)``) must call :meth:`GraphedFunction.reset` first. ``fn``
must be free of host synchronisation and host-dependent control flow (a capture that
meets one fails with one line naming the switch that turns graphs off). Under a
``TorchDispatchMode`` (``FlopCounterMode`` in the benchmark's FLOP count) ``fn`` runs
eagerly, so the mode sees its operations; a replay would hide them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

Signature = tuple[tuple[tuple[int, ...], torch.dtype], ...]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]


class GraphedFunction:
    """``fn(*tensors) -> tuple of tensors`` on ``device``, replayed from CUDA graphs.

    ``switch``: the recipe key that turns this off, for the capture error. ``warmup``: eager
    calls on a side stream before a capture (lazy initialisation, cuBLAS workspaces).
    ``captures`` counts the graphs captured so far, ``replays`` the calls served.
    """

    def __init__(
        self,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        *,
        device: torch.device,
        switch: str,
        warmup: int = 2,
    ) -> None:
        if device.type != "cuda":
            raise ValueError(
                f"{switch}=true needs a CUDA device; this one runs on {device}: set it false"
            )
        self.fn = fn
        self.device = device
        self.switch = switch
        self.warmup = warmup
        self._graphs: dict[Signature, _Captured] = {}
        self._pool: _POOL_HANDLE | None = None
        self.captures = 0
        self.replays = 0

    @staticmethod
    def signature(inputs: tuple[torch.Tensor, ...]) -> Signature:
        return tuple((tuple(t.shape), t.dtype) for t in inputs)

    def reset(self) -> None:
        """Forget every graph (call before the weights ``fn`` reads move)."""
        self._graphs.clear()
        self._pool = None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if _get_current_dispatch_mode() is not None:
            return tuple(self.fn(*inputs))
        key = self.signature(inputs)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._graphs[key] = self._capture(inputs)
        for static, value in zip(captured.inputs, inputs, strict=True):
            static.copy_(value, non_blocking=True)
        captured.graph.replay()
        self.replays += 1
        return tuple(out.clone() for out in captured.outputs)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Captured:
        static = tuple(t.to(self.device, non_blocking=True).clone() for t in inputs)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = tuple(self.fn(*static))
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RuntimeError(
                f"{self.switch}: CUDA graph capture failed for inputs "
                f"{[tuple(t.shape) for t in inputs]} ({first}); set {self.switch}=false"
            ) from exc
        self.captures += 1
        return _Captured(graph=graph, inputs=static, outputs=outputs)
