"""``DedicatedEngine``: our own rollout engine with a separate inference copy of the model.

It builds its own bundle from a bundle block (bf16 on GPU, fp32 on CPU by default — a copy
independent of the trainer's fp32 master) and its own flow-matching pipeline from a pipeline
block, samples with the shared denoise loop (so per-step log-probs match a trainside replay),
and receives weights through the ``WeightReceiver`` mixin. ``sleep()`` moves every module of
its bundle off the GPU and empties the CUDA cache; ``wake_up()`` brings them back.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import time
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from unirl.config.precision import canonical_precision
from unirl.config.require import require
from unirl.config.typecheck import PositiveInt
from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.weight_sync.receiver import ModuleReceiver, WeightReceiver
from unirl.types import RolloutReq, RolloutResp


def plain_block(block: Any) -> Any:
    """DictConfig -> plain containers (other values unchanged)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(block):
            return OmegaConf.to_container(block, resolve=True)
    except ImportError:  # pragma: no cover - hydra/omegaconf are core dependencies
        pass
    return block


def build_bundle(bundle: Any, *, dtype: str | None, device: str | None) -> Any:
    """The engine's own bundle from a ``_target_`` block (``dtype`` / ``device`` override the
    block's); an already-built object is used as it is."""
    bundle = plain_block(bundle)
    if not isinstance(bundle, Mapping):
        require(
            dtype is None and device is None,
            "rollout.dtype / rollout.device need a bundle *block*, not a built bundle",
        )
        return bundle
    require(
        "_target_" in bundle,
        "rollout.bundle must be a bundle block with _target_ (e.g. bundle: ${bundle})",
    )
    spec = dict(bundle)
    if dtype is not None:
        spec["dtype"] = dtype
    if device is not None:
        spec["device"] = device
    from hydra.utils import instantiate

    return instantiate(spec, _convert_="object")


def build_pipeline(pipeline: Any, bundle: Any) -> Any:
    """A pipeline bound to ``bundle`` from a ``_target_`` block or a partial."""
    pipeline = plain_block(pipeline)
    if isinstance(pipeline, Mapping):
        require(
            "_target_" in pipeline,
            "rollout.pipeline must be a pipeline block with _target_ (e.g. pipeline: ${pipeline})",
        )
        from hydra.utils import instantiate

        factory = instantiate(dict(pipeline), _convert_="object", _partial_=True)
        return factory(bundle=bundle)
    require(
        isinstance(pipeline, functools.partial),
        "rollout.pipeline must be a block (or a partial) so the engine can bind it to its own bundle copy",
    )
    return pipeline(bundle=bundle)


def _modules(bundle: Any) -> list[nn.Module]:
    return [m for m in vars(bundle).values() if isinstance(m, nn.Module)]


def _bytes(modules: list[nn.Module]) -> int:
    total = 0
    for m in modules:
        for t in [*m.parameters(), *m.buffers()]:
            total += t.numel() * t.element_size()
    return total


class DedicatedEngine(WeightReceiver):
    """A separate inference copy of the pipeline, same ``generate`` contract as trainside.

    ``bundle`` / ``pipeline``: the recipe's blocks (``${bundle}`` / ``${pipeline}``; set
    ``_recursive_: false`` on the rollout block so Hydra leaves them to the engine).
    ``dtype``: the copy's precision (default ``bf16`` on CUDA, ``fp32`` on CPU).
    ``device``: ``cpu`` | ``cuda`` | ``auto``. ``compile``: ``torch.compile`` the transformer.
    ``trainable_attr``: the bundle attribute weight syncs write into (default: the family's
    first ``trainable_module_names`` entry, e.g. ``transformer``). ``forward_batch_size``:
    samples one denoise loop runs at once (sets the pipeline's; null keeps the pipeline's own).
    """

    engine_kind = "dedicated"

    def __init__(
        self,
        *,
        bundle: Any,
        pipeline: Any,
        dtype: str | None = None,
        device: Literal["cpu", "cuda", "auto"] | None = None,
        compile: bool = False,
        forward_batch_size: PositiveInt | None = None,
        trainable_attr: str | None = None,
    ) -> None:
        require(
            forward_batch_size is None or forward_batch_size >= 1,
            "rollout.forward_batch_size must be >= 1",
        )
        require(
            device in (None, "cpu", "cuda", "auto"),
            f"rollout.device must be cpu, cuda or auto, got {device!r}",
        )
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype is None:  # bf16 on GPU, fp32 on CPU
            plain = plain_block(bundle)
            target = device or (
                plain.get("device", "cpu")
                if isinstance(plain, Mapping)
                else getattr(plain, "device", "cpu")
            )
            on_gpu = str(target).startswith("cuda") or (
                str(target) == "auto" and torch.cuda.is_available()
            )
            dtype = "bf16" if on_gpu else "fp32"
        dtype = canonical_precision(dtype, "rollout.dtype")
        t0 = time.perf_counter()
        self.bundle = build_bundle(bundle, dtype=dtype, device=device)
        self.pipeline = build_pipeline(pipeline, self.bundle)
        if forward_batch_size is not None:
            self.pipeline.forward_batch_size = forward_batch_size
        if trainable_attr is None:  # the family names its trainable module(s)
            names = getattr(self.bundle, "trainable_module_names", None)
            require(
                bool(names),
                f"rollout.trainable_attr: {type(self.bundle).__name__} declares no "
                "trainable_module_names; name the module weight syncs write into",
            )
            assert names  # the require above refuses an empty or missing list
            trainable_attr = str(names[0])
        self.trainable_attr = trainable_attr
        module = getattr(self.bundle, trainable_attr, None)
        require(
            isinstance(module, nn.Module),
            f"rollout.trainable_attr={trainable_attr!r} is not a module of the bundle",
        )
        assert isinstance(module, nn.Module)  # the require above refuses anything else
        module.requires_grad_(False).eval()
        self.compiled = bool(compile)
        if compile:
            setattr(self.bundle, trainable_attr, torch.compile(module))
        self.receiver = ModuleReceiver(self._trainable, where="DedicatedEngine")
        self.asleep = False
        self.home = torch.device(self.bundle.device)
        self.build_time_s = time.perf_counter() - t0

    def _trainable(self) -> nn.Module:
        module = getattr(self.bundle, self.trainable_attr)
        return getattr(module, "_orig_mod", module)  # peft edits the module torch.compile wraps

    # -- WeightReceiver hooks --------------------------------------------------------------------

    def _weight_receiver(self) -> ModuleReceiver:
        return self.receiver

    # -- the contract --------------------------------------------------------------------------------

    @distributed(dispatch=Dispatch.DP_SCATTER)
    def generate(self, req: RolloutReq) -> RolloutResp:
        """Sample this rank's shard of ``req`` with the engine's own weights."""
        if self.asleep:
            raise RuntimeError(
                "DedicatedEngine.generate while asleep; the driver calls wake_up() first"
            )
        resp = self.pipeline.generate(req)
        for name, track in resp.tracks.items():  # the pixels go to the driver on CPU
            if track.decoded is not None:
                resp.tracks[name] = dataclasses.replace(track, decoded=track.decoded.to("cpu"))
        return resp

    @distributed(dispatch=Dispatch.BROADCAST)
    def sleep(self) -> dict[str, float]:
        """Free the engine's device memory (every bundle module to CPU, CUDA cache emptied).
        Returns ``engine_bytes`` (weights + buffers) and ``freed_bytes`` (CUDA allocator
        delta; on CPU the bytes that would be freed, nothing moves)."""
        modules = _modules(self.bundle)
        size = _bytes(modules)
        if self.asleep:
            return {"engine_bytes": float(size), "freed_bytes": 0.0}
        freed = float(size)
        if self.home.type == "cuda":
            before = torch.cuda.memory_allocated(self.home)
            self.bundle.to("cpu")
            gc.collect()
            torch.cuda.empty_cache()
            freed = float(before - torch.cuda.memory_allocated(self.home))
        self.asleep = True
        return {"engine_bytes": float(size), "freed_bytes": freed}

    @distributed(dispatch=Dispatch.BROADCAST)
    def wake_up(self) -> dict[str, float]:
        """Restore what ``sleep()`` freed; returns ``restored_bytes``."""
        if not self.asleep:
            return {"restored_bytes": 0.0}
        size = float(_bytes(_modules(self.bundle)))
        if self.home.type == "cuda":
            before = torch.cuda.memory_allocated(self.home)
            self.bundle.to(self.home)
            size = float(torch.cuda.memory_allocated(self.home) - before)
        self.asleep = False
        return {"restored_bytes": size}

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def describe(self) -> dict[str, Any]:
        module = self._trainable()
        return {
            "device": str(self.bundle.device),
            "dtype": str(next(module.parameters()).dtype),
            "params": int(sum(p.numel() for p in module.parameters())),
            "engine_bytes": _bytes(_modules(self.bundle)),
            "build_time_s": self.build_time_s,
            "compiled": self.compiled,
        }
