"""The receiving side of a weight sync.

``ModuleReceiver`` applies named tensors to one ``nn.Module`` (an engine's inference copy):
it builds the name table (full parameters, or the peft adapter tensors under the trainer's
saved-state names), injects an adapter equal to the trainer's on the first LoRA sync, copies
tensors in (casting to the engine's dtype and device), merges LoRA into the base weights on
request, and reads back bit-exact checksums.

``WeightReceiver`` is the mixin that gives an engine role its driver-callable receivers
(``prepare_sync``, ``receive_tensors``, ``receive_ref``, ``join_sync_group``,
``receive_collective``, ``receive_ipc``, ``receive_tensor_buckets``, ``checksums``). An
engine supplies ``_weight_receiver()``; engines whose weights live elsewhere (an external
server) override ``_sync_prepare`` / ``_apply_synced`` instead, and
``_apply_tensor_buckets`` to forward the ``tensor`` transport's buckets one by one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.weight_sync.base import strip_adapter
from unirl.distributed.weight_sync.bucket import plan_buckets, unpack
from unirl.distributed.weight_sync.checksum import tensor_checksum
from unirl.distributed.weight_sync.group import SyncGroup
from unirl.distributed.weight_sync.ipc import IpcPayload, open_ipc_payload
from unirl.distributed.weight_sync.manifest import (
    SyncManifest,
    WeightSyncError,
    check_manifest,
    compare_checksums,
)
from unirl.distributed.weight_sync.remap import canonical_name
from unirl.distributed.weight_sync.tensor_wire import DecodedBucket, decode_bucket

if TYPE_CHECKING:
    from ray import ObjectRef

_LORA_DICTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


def _is_lora_param(name: str) -> bool:
    return any(f".{d}." in f".{name}" for d in _LORA_DICTS)


class ModuleReceiver:
    """Applies synced tensors to ``module_fn()`` (called each time: wrappers may replace it)."""

    def __init__(self, module_fn: Callable[[], nn.Module], *, where: str = "engine") -> None:
        self._module_fn = module_fn
        self.where = where
        self.lora_config: dict[str, Any] | None = None
        self._pristine: dict[str, torch.Tensor] = {}  # merged LoRA: base weights before any merge

    @property
    def module(self) -> nn.Module:
        return self._module_fn()

    # -- tables ------------------------------------------------------------------------------

    def table(self, kind: str) -> dict[str, torch.Tensor]:
        """Engine name -> live tensor: ``full`` (non-LoRA parameters) or ``lora`` (the adapter's
        tensors named as the trainer's ``adapter_state_dict`` names them)."""
        named = self.module.named_parameters()
        if kind == "full":
            return {canonical_name(n): p for n, p in named if not _is_lora_param(n)}
        if kind != "lora":
            raise WeightSyncError(f"{self.where}: unknown sync kind {kind!r}")
        if self.lora_config is None:
            return {}
        adapter = self.lora_config["adapter_name"]
        out: dict[str, torch.Tensor] = {}
        for n, p in named:
            if _is_lora_param(n) and f".{adapter}." in f".{n}.":
                out[canonical_name(strip_adapter(n, adapter))] = p
        return out

    # -- LoRA ------------------------------------------------------------------------------------

    def ensure_lora(self, config: Mapping[str, Any]) -> None:
        """Inject an adapter equal to the trainer's (first sync) or check the existing one."""
        config = dict(config)
        if self.lora_config is not None:
            keys = ("r", "lora_alpha", "target_modules", "use_rslora", "adapter_name")
            diff = {
                k: (self.lora_config.get(k), config.get(k))
                for k in keys
                if self.lora_config.get(k) != config.get(k)
            }
            if diff:
                raise WeightSyncError(
                    f"{self.where}: the trainer's LoRA settings changed since the engine's adapter was "
                    f"injected (engine, trainer): {diff}"
                )
            return
        import peft
        from peft.functional import inject_adapter_in_model

        module = self.module
        peft_config = peft.LoraConfig(
            r=int(config["r"]),
            lora_alpha=config["lora_alpha"],
            target_modules=list(config["target_modules"]),
            use_rslora=bool(config.get("use_rslora", False)),
            lora_dropout=0.0,
            init_lora_weights=True,  # B = 0: the identity until the first tensors land
        )
        with torch.random.fork_rng(devices=[]):
            inject_adapter_in_model(peft_config, module, adapter_name=config["adapter_name"])
        self.lora_config = config
        # inference copy: adapter in the dtype of the layer it adapts, never trained
        from peft.tuners.tuners_utils import BaseTunerLayer

        for layer in module.modules():
            if isinstance(layer, BaseTunerLayer):
                base = layer.get_base_layer()
                dtype = cast(torch.Tensor, base.weight).dtype
                for name, p in layer.named_parameters():
                    if _is_lora_param(name):
                        p.data = p.data.to(dtype)
        module.requires_grad_(False)
        if not self.table("lora"):
            raise WeightSyncError(
                f"{self.where}: peft injected no LoRA tensors for target_modules={config['target_modules']}; "
                "the engine's module does not have the trainer's layers"
            )

    @torch.no_grad()
    def merge_lora(self) -> int:
        """Fold the adapter into the base weights (from pristine copies, so no drift); returns
        the number of merged layers."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        assert self.lora_config is not None
        adapter = self.lora_config["adapter_name"]
        merged = 0
        for name, layer in self.module.named_modules():
            if not isinstance(layer, BaseTunerLayer):
                continue
            weight = cast(torch.Tensor, layer.get_base_layer().weight)
            if name not in self._pristine:
                keep = weight.detach().to("cpu", copy=True)
                self._pristine[name] = keep.pin_memory() if weight.is_cuda else keep
            else:
                weight.copy_(self._pristine[name])
            layer.merged_adapters.clear()
            layer.merge(adapter_names=[adapter])
            merged += 1
        return merged

    def lora_merged(self) -> bool:
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [m for m in self.module.modules() if isinstance(m, BaseTunerLayer)]
        return bool(layers) and all(layer.merged for layer in layers)

    # -- apply and read back ---------------------------------------------------------------------

    def prepare(self, manifest: SyncManifest) -> dict[str, str]:
        """Inject LoRA if needed and check ``manifest`` against the table; returns the engine
        dtype of every entry."""
        if manifest.kind == "lora":
            if manifest.lora_config is None:
                raise WeightSyncError(f"{self.where}: a LoRA sync manifest without lora_config")
            self.ensure_lora(manifest.lora_config)
        return check_manifest(
            manifest,
            self.table(manifest.kind),
            where=self.where,
            require_complete=manifest.kind == "lora",
        )

    @torch.no_grad()
    def apply(self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor]) -> int:
        """Copy every manifest entry from ``tensors`` (engine names) into the module; returns
        bytes received. Merges LoRA afterwards when the manifest asks for it."""
        table = self.table(manifest.kind)
        missing = [e.name for e in manifest.entries if e.name not in tensors]
        if missing:
            raise WeightSyncError(
                f"{self.where}: the payload lacks {len(missing)} manifest tensor(s): {missing[:8]}"
            )
        received = 0
        for e in manifest.entries:
            src = tensors[e.name]
            dst = table[e.name]
            if tuple(src.shape) != tuple(dst.shape):
                raise WeightSyncError(
                    f"{self.where}: {e.name} arrived as {list(src.shape)}, engine holds {list(dst.shape)}"
                )
            dst.copy_(src)
            received += src.numel() * src.element_size()
        if manifest.kind == "lora" and manifest.merged_lora:
            self.merge_lora()
        return received

    def checksums(self, kind: str, names: list[str] | None = None) -> dict[str, int]:
        """Read-back checksums of the live tensors (all of ``kind`` or just ``names``)."""
        table = self.table(kind)
        wanted = list(table) if names is None else names
        return {n: tensor_checksum(table[n]) for n in wanted if n in table}


class WeightReceiver:
    """Mixin: driver-callable weight-sync receivers for an engine role (see module docstring)."""

    _sync_group: SyncGroup | None = None
    _sync_manifest: SyncManifest | None = None

    # -- what an engine supplies ---------------------------------------------------------------

    def _weight_receiver(self) -> ModuleReceiver:
        raise NotImplementedError(f"{type(self).__name__} must implement _weight_receiver()")

    def _sync_prepare(self, manifest: SyncManifest) -> dict[str, str]:
        return self._weight_receiver().prepare(manifest)

    def _apply_synced(
        self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, object]:
        """Apply and read back: ``{"bytes", "checksums"}`` (checksums under engine names)."""
        receiver = self._weight_receiver()
        received = receiver.apply(manifest, tensors)
        out: dict[str, object] = {
            "bytes": received,
            "checksums": receiver.checksums(manifest.kind, manifest.names),
        }
        if manifest.kind == "lora" and manifest.merged_lora:
            out["merged"] = receiver.lora_merged()
        return out

    def _apply_tensor_buckets(
        self, manifest: SyncManifest, buckets: Iterable[DecodedBucket]
    ) -> dict[str, object]:
        """The ``tensor`` transport's buckets (decoded, each verified): by default all of them,
        then one :meth:`_apply_synced`. A server-backed engine forwards bucket by bucket."""
        tensors: dict[str, torch.Tensor] = {}
        for bucket in buckets:
            tensors.update(bucket.tensors)
        return self._apply_synced(manifest, tensors)

    # -- the receivers ---------------------------------------------------------------------------

    def _check_prepared(self, manifest: SyncManifest) -> None:
        if self._sync_manifest is None or self._sync_manifest.names != manifest.names:
            raise WeightSyncError(
                f"{type(self).__name__}: receive before prepare_sync (or with a different manifest); "
                "the driver prepares every sync"
            )

    def _report(
        self, manifest: SyncManifest, tensors: Mapping[str, torch.Tensor], t0: float
    ) -> dict[str, object]:
        self._check_prepared(manifest)
        return self._finish(manifest, self._apply_synced(manifest, tensors), t0)

    def _finish(
        self, manifest: SyncManifest, out: dict[str, object], t0: float
    ) -> dict[str, object]:
        if manifest.expected:
            checksums = cast("dict[str, int]", out["checksums"])  # _apply_synced's read-back
            compare_checksums(
                manifest.expected, checksums, where=f"{type(self).__name__} read-back"
            )
        out["num_tensors"] = len(manifest.entries)
        out["time_s"] = time.perf_counter() - t0
        return out

    @distributed(dispatch=Dispatch.BROADCAST)
    def prepare_sync(self, manifest: SyncManifest) -> dict[str, str]:
        """Check ``manifest`` against this engine (fail fast, before any byte moves); returns
        the engine dtype of every entry."""
        dtypes = self._sync_prepare(manifest)
        self._sync_manifest = manifest
        return dtypes

    def receive_local(
        self, tensors: Mapping[str, torch.Tensor], manifest: SyncManifest
    ) -> dict[str, object]:
        """In-process hand-over from a colocated ``SyncSource`` (not driver-callable)."""
        return self._report(manifest, tensors, time.perf_counter())

    @distributed(dispatch=Dispatch.BROADCAST)
    def receive_tensors(
        self, tensors: dict[str, torch.Tensor], manifest: SyncManifest
    ) -> dict[str, object]:
        """Apply tensors passed by value (the driver relays them)."""
        return self._report(manifest, tensors, time.perf_counter())

    @distributed(dispatch=Dispatch.BROADCAST)
    def receive_ref(self, box: list[ObjectRef], manifest: SyncManifest) -> dict[str, object]:
        """Apply the payload trainer rank 0 put in Ray's object store (``box = [ObjectRef]``)."""
        import ray

        t0 = time.perf_counter()
        tensors = ray.get(box[0])
        return self._report(manifest, tensors, t0)

    @distributed(dispatch=Dispatch.BROADCAST)
    def join_sync_group(
        self, host: str, port: int, world_size: int, backend: str, timeout_s: float
    ) -> int:
        """Join the weight-sync group as rank ``1 + this engine's slab rank``; returns it."""
        from unirl.distributed.group.role import current_rank_info

        rank = 1 + current_rank_info().rank
        if self._sync_group is None:
            self._sync_group = SyncGroup(
                host=host,
                port=port,
                rank=rank,
                world_size=world_size,
                backend=backend,
                timeout_s=timeout_s,
            )
        return rank

    @distributed(dispatch=Dispatch.BROADCAST)
    def receive_collective(self, manifest: SyncManifest, bucket_bytes: int) -> dict[str, object]:
        """Receive the bucketed broadcast from trainer rank 0 and apply it bucket by bucket."""
        if self._sync_group is None:
            raise WeightSyncError(
                f"{type(self).__name__}: receive_collective before join_sync_group"
            )
        t0 = time.perf_counter()
        device = (
            self._sync_group.device if self._sync_group.backend == "nccl" else torch.device("cpu")
        )
        tensors: dict[str, torch.Tensor] = {}
        for bucket in plan_buckets(manifest.entries, bucket_bytes):
            buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
            self._sync_group.broadcast(buf, src=0)
            tensors.update(unpack(bucket, buf))
        return self._report(manifest, tensors, t0)

    @distributed(dispatch=Dispatch.BROADCAST)
    def receive_ipc(self, payload: IpcPayload, manifest: SyncManifest) -> dict[str, object]:
        """Open CUDA IPC handles from a trainer in another process on this GPU and copy."""
        t0 = time.perf_counter()
        return self._report(manifest, open_ipc_payload(payload), t0)

    @distributed(dispatch=Dispatch.BROADCAST)
    def receive_tensor_buckets(
        self,
        boxes: Sequence[list[ObjectRef] | bytes | bytearray | memoryview],
        manifest: SyncManifest,
    ) -> dict[str, object]:
        """Tensor transport: decode and verify each bucket (``[ObjectRef]`` boxes from
        ``SyncSource.export_buckets``, or the encoded bytes themselves), in order, and apply
        them (``_apply_tensor_buckets``)."""
        t0 = time.perf_counter()
        self._check_prepared(manifest)

        def buckets() -> Iterator[DecodedBucket]:
            for i, box in enumerate(boxes):
                if isinstance(box, bytes | bytearray | memoryview):
                    payload = box
                else:
                    import ray

                    payload = ray.get(box[0])
                bucket = decode_bucket(payload)
                if (bucket.index, bucket.total) != (i, len(boxes)):
                    raise WeightSyncError(
                        f"{type(self).__name__}: got bucket {bucket.index} of {bucket.total} "
                        f"as number {i} of {len(boxes)} (buckets reordered or lost)"
                    )
                yield bucket

        return self._finish(manifest, self._apply_tensor_buckets(manifest, buckets()), t0)

    @distributed(dispatch=Dispatch.BROADCAST)
    def checksums(self, kind: str | None = None, names: list[str] | None = None) -> dict[str, int]:
        """Read-back checksums of the engine's synced tensors (``kind`` defaults to the last
        sync's); ``{}`` before the first sync of a LoRA engine."""
        if kind is None:
            kind = self._sync_manifest.kind if self._sync_manifest is not None else "full"
        return self._weight_receiver().checksums(kind, names)

    @distributed(dispatch=Dispatch.BROADCAST)
    def leave_sync_group(self) -> None:
        if self._sync_group is not None:
            self._sync_group.close()
            self._sync_group = None
