"""``WeightSync``: the options every trainer -> engine sync shares, and what it collects.

A recipe's ``sync`` block builds one subclass (``LoraSync``, ``FullSync``, ``CudaIpcSync``).
The same object is built on the train workers (``SyncSource`` collects and sends with it)
and on the driver (``WeightSyncDriver`` orchestrates with it); it holds no tensors itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, cast

import torch
from torch import nn

from unirl.config.precision import parse_dtype
from unirl.config.require import require
from unirl.config.typecheck import PositiveFloat, PositiveInt
from unirl.distributed.weight_sync.manifest import SyncManifest, TensorMeta, WeightSyncError
from unirl.distributed.weight_sync.remap import NameRemap, RemapRule, canonical_name

if TYPE_CHECKING:
    from peft import LoraConfig


class SyncBackend(Protocol):
    """What a sync collects from (``unirl.train.backend.FSDPBackend`` provides it; ``has_lora``,
    ``adapters``, ``lora`` and ``device`` are read with ``getattr`` defaults)."""

    @property
    def module(self) -> nn.Module: ...

    def named_trainable_parameters(self) -> Sequence[tuple[str, torch.Tensor]]: ...

    def adapter_state_dict(self, adapter: str | None = None) -> Mapping[str, torch.Tensor]: ...

    def full_trainable_state(self) -> Mapping[str, torch.Tensor]: ...


_LORA_DICTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")
TRANSPORTS = ("auto", "local", "object_store", "collective", "cuda_ipc", "tensor")


def strip_adapter(name: str, adapter: str) -> str:
    """``blocks.0.to_q.lora_A.default.weight`` -> ``blocks.0.to_q.lora_A.weight`` (peft's
    saved-state naming); names of other parameters are returned unchanged."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in _LORA_DICTS and parts[i + 1] == adapter:
            return ".".join(parts[: i + 1] + parts[i + 2 :])
    return name


class WeightSync:
    """Common options of a trainer -> rollout-engine weight sync.

    ``interval``: sync every ``interval`` rollouts (``None``: the run's ``sync_interval``); the
    first rollout of a run (fresh or resumed) is always preceded by a sync.
    ``name_remap``: rules (``{prefix: ..., to: ...}`` / ``{regex: ..., to: ...}``) rewriting
    trainer names into engine names, applied in order after wrapper tokens are stripped.
    ``merged_lora``: the receiver merges the LoRA delta into its base weights after loading.
    ``wire_dtype``: dtype on the wire (``None``: the receiver's own dtype, cast on the sender).
    ``transport``: ``auto`` | ``local`` (colocated siblings hand tensors over in-process) |
    ``object_store`` (Ray object store, any layout) | ``collective`` (bucketed broadcast over a
    dedicated torch.distributed group; separate layout) | ``cuda_ipc`` (``CudaIpcSync`` only) |
    ``tensor`` (checksummed byte buckets that the engine forwards through its own HTTP / RPC
    API, e.g. an SGLang server or vLLM-Omni workers on a node without NCCL; any layout).
    ``bucket_mb``: bucket size of collective and tensor transfers. ``timeout_s`` bounds the group's
    rendezvous and every collective.
    ``source_adapter`` (LoRA syncs): the trainer's adapter whose tensors the engine receives
    (``None``: the trained one). DiffusionNFT samples its train rollouts with the frozen
    ``old`` adapter (an EMA of the trained one, updated in ``after_train``, before the sync
    runs): on an external engine, which holds one adapter, ``source_adapter: old`` makes it
    sample what the trainside engine would switch to. The engine's copy keeps the trained
    adapter's name; only the tensors differ.
    """

    kind: ClassVar[str] = "full"
    fixed_kind: ClassVar[bool] = True  # False: the kind is resolved against the backend
    default_transport: ClassVar[dict[str, str]] = {"colocate": "local", "separate": "collective"}
    allowed_transports: ClassVar[tuple[str, ...]] = (
        "local",
        "object_store",
        "collective",
        "tensor",
    )

    def __init__(
        self,
        *,
        interval: PositiveInt | None = None,
        name_remap: Sequence[RemapRule | Mapping[str, str]] | None = None,
        merged_lora: bool = False,
        wire_dtype: str | None = None,
        transport: Literal[
            "auto", "local", "object_store", "collective", "cuda_ipc", "tensor"
        ] = "auto",
        bucket_mb: PositiveFloat = 512.0,
        timeout_s: PositiveFloat = 600.0,
        source_adapter: str | None = None,
    ) -> None:
        require(
            interval is None or interval >= 1, f"sync.interval must be >= 1 or null, got {interval}"
        )
        require(
            transport in TRANSPORTS,
            f"sync.transport must be one of {list(TRANSPORTS)}, got {transport!r}",
        )
        require(
            transport == "auto" or transport in self.allowed_transports,
            f"sync.transport={transport!r} is not available for {type(self).__name__}; "
            f"choose from {['auto', *self.allowed_transports]}",
        )
        require(bucket_mb > 0, f"sync.bucket_mb must be > 0, got {bucket_mb}")
        require(timeout_s > 0, f"sync.timeout_s must be > 0, got {timeout_s}")
        require(
            source_adapter is None or (bool(source_adapter) and self.kind == "lora"),
            f"sync.source_adapter={source_adapter!r}: only a LoRA sync moves a named adapter "
            "(sync._target_=unirl.distributed.weight_sync.LoraSync); leave it null otherwise",
        )
        self.source_adapter = source_adapter
        self.interval = interval
        self.remap = NameRemap(name_remap)
        self.merged_lora = bool(merged_lora)
        self.wire_dtype = (
            parse_dtype(wire_dtype, "sync.wire_dtype") if wire_dtype is not None else None
        )
        self.transport = transport
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = float(timeout_s)

    # -- layout --------------------------------------------------------------------------------

    def transport_for(self, layout: str) -> str:
        """The transport this sync uses under ``layout`` (``colocate`` | ``separate``)."""
        transport = self.default_transport[layout] if self.transport == "auto" else self.transport
        if transport == "local":
            require(
                layout == "colocate",
                f"{type(self).__name__}: transport=local hands tensors to a sibling on the same worker, "
                "so it needs layout=colocate; use object_store or collective with layout=separate",
            )
        if transport == "collective":
            require(
                layout == "separate",
                f"{type(self).__name__}: transport=collective runs sender and receivers as different "
                "processes at once, so it needs layout=separate (colocated siblings share one process); "
                "use transport=local",
            )
        return transport

    # -- trainer side ------------------------------------------------------------------------------

    @staticmethod
    def check_trained(kind: str, sync_name: str, has_lora: bool) -> None:
        """Raise ``ConfigError`` when a ``kind`` (``lora`` | ``full``) sync cannot move what
        the backend trains."""
        if kind == "lora":
            require(
                has_lora,
                f"sync: {sync_name} moves LoRA adapters but backend.lora is null; use "
                "sync._target_=unirl.distributed.weight_sync.FullSync",
            )
        else:
            require(
                not has_lora,
                f"sync: {sync_name} moves the trainable parameters, but the backend trains a "
                "LoRA adapter: use sync._target_=unirl.distributed.weight_sync.LoraSync (with "
                "merged_lora=true if the engine should run merged weights)",
            )

    @classmethod
    def check_config(cls, block: Mapping[str, object], recipe: object) -> None:
        """Before anything is built: the sync fits what the recipe's backend trains."""
        backend = getattr(recipe, "backend", None)
        if isinstance(backend, Mapping) and cls.fixed_kind:
            cls.check_trained(cls.kind, cls.__name__, backend.get("lora") is not None)

    def check_backend(self, backend: SyncBackend) -> None:
        """Raise ``ConfigError`` when this sync cannot move what ``backend`` trains."""
        self.check_trained(
            self.kind, type(self).__name__, bool(getattr(backend, "has_lora", False))
        )
        present = list(getattr(backend, "adapters", None) or [])
        require(
            self.source_adapter is None or self.source_adapter in present,
            f"sync.source_adapter={self.source_adapter!r} is not an adapter of the backend "
            f"(present: {present}); add it with backend.lora.extra_adapters",
        )

    def adapter_name(self, backend: SyncBackend) -> str:
        lora = getattr(backend, "lora", None)
        return str(getattr(lora, "adapter_name", "default"))

    def manifest(self, backend: SyncBackend) -> SyncManifest:
        """Names, shapes and dtypes of what :meth:`collect` returns (no communication)."""
        entries = []
        adapter = self.adapter_name(backend)
        for name, p in backend.named_trainable_parameters():
            source = canonical_name(strip_adapter(name, adapter) if self.kind == "lora" else name)
            entries.append(
                TensorMeta(
                    name=self.remap(source),
                    source=source,
                    shape=tuple(p.shape),
                    dtype=str(p.dtype),
                    wire_dtype="",
                )
            )
        return SyncManifest(
            kind=self.kind,
            entries=tuple(entries),
            lora_config=self.lora_config(backend) if self.kind == "lora" else None,
            merged_lora=self.merged_lora,
            remap=self.remap.describe(),
        )

    def lora_config(self, backend: SyncBackend) -> dict[str, object]:
        """The trained adapter's peft settings, so the receiver can inject an equal adapter."""
        adapter = self.adapter_name(backend)
        configs = cast("Mapping[str, LoraConfig]", backend.module.peft_config)
        peft_config = configs[adapter]
        targets = peft_config.target_modules
        return {
            "r": int(peft_config.r),
            "lora_alpha": float(peft_config.lora_alpha),
            "target_modules": sorted(targets)
            if isinstance(targets, set | list | tuple)
            else targets,
            "use_rslora": bool(getattr(peft_config, "use_rslora", False)),
            "adapter_name": adapter,
        }

    def collect(self, backend: SyncBackend) -> dict[str, torch.Tensor]:
        """Full (unsharded) tensors under canonical trainer names, on every train rank (a
        collective under FSDP: call on every train rank)."""
        if self.kind == "lora":
            state = backend.adapter_state_dict(self.source_adapter)
        else:
            state = backend.full_trainable_state()
        return {canonical_name(k): v for k, v in state.items()}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(interval={self.interval}, transport={self.transport!r}, "
            f"wire_dtype={self.wire_dtype}, merged_lora={self.merged_lora}, name_remap={self.remap.describe()})"
        )


def build_sync(spec: object) -> WeightSync:
    """A ``WeightSync`` from an instance or a ``_target_`` mapping (a recipe's ``sync`` block)."""
    if isinstance(spec, WeightSync):
        return spec
    if isinstance(spec, Mapping):
        from hydra.utils import instantiate

        obj = instantiate(dict(spec), _convert_="object")
        if isinstance(obj, WeightSync):
            return obj
        raise WeightSyncError(
            f"sync._target_ {spec.get('_target_')!r} does not build a WeightSync (got {type(obj).__name__})"
        )
    raise WeightSyncError(
        f"sync must be a WeightSync or a _target_ mapping, got {type(spec).__name__}"
    )
