"""``SyncSource``: the train-side role of a weight sync (one per train worker).

Every train rank takes part in gathering the full tensors (a collective under FSDP); trainer
rank 0 alone sends them (object store, collective broadcast), except in the colocate layout
where each rank hands its gathered copy to the engine sibling on its own worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

import torch

from unirl.distributed.group.dispatch import Dispatch, distributed
from unirl.distributed.weight_sync.base import SyncBackend, WeightSync, build_sync
from unirl.distributed.weight_sync.bucket import pack, plan_buckets
from unirl.distributed.weight_sync.checksum import tensor_checksum
from unirl.distributed.weight_sync.group import SyncGroup, free_port, node_address
from unirl.distributed.weight_sync.ipc import IpcPayload, build_ipc_payload
from unirl.distributed.weight_sync.manifest import SyncManifest, WeightSyncError, dtype_of
from unirl.distributed.weight_sync.tensor_wire import encode_bucket


class ColocatedEngine(Protocol):
    """The engine sibling on the same worker (``WeightReceiverMixin`` provides it): the
    colocate layout hands tensors over in-process."""

    def receive_local(
        self, tensors: Mapping[str, torch.Tensor], manifest: SyncManifest
    ) -> dict[str, object]: ...

    def receive_ipc(self, payload: IpcPayload, manifest: SyncManifest) -> dict[str, object]: ...


class SyncSource:
    """Collects the trainer's tensors with ``sync`` and sends them.

    ``backend``: the sibling ``FSDPBackend`` (duck-typed: ``named_trainable_parameters``,
    ``adapter_state_dict`` / ``full_trainable_state``, ``has_lora``, ``module``, ``device``).
    ``engine``: the sibling engine on the same worker (colocate layout only).
    """

    def __init__(
        self,
        *,
        backend: SyncBackend,
        sync: WeightSync | Mapping[str, object],
        engine: ColocatedEngine | None = None,
    ) -> None:
        self.backend = backend
        self.sync = build_sync(sync)
        self.sync.check_backend(backend)
        self.engine = engine
        self._group: SyncGroup | None = None
        self._keepalive: dict[str, torch.Tensor] = {}

    def _rank(self) -> int:
        from unirl.distributed.group.role import current_rank_info

        return current_rank_info().rank

    # -- planning ---------------------------------------------------------------------------------

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def manifest(self) -> SyncManifest:
        """Names, shapes, dtypes (no tensors, no communication)."""
        return self.sync.manifest(self.backend)

    def _wire(self, manifest: SyncManifest) -> dict[str, torch.Tensor]:
        """Gather (collective), rename, cast to the wire dtypes."""
        state = self.sync.collect(self.backend)
        by_source = {e.source: e for e in manifest.entries}
        missing = sorted(set(by_source) - set(state))
        extra = sorted(set(state) - set(by_source))
        if missing or extra:
            raise WeightSyncError(
                f"SyncSource: the collected {manifest.kind} tensors differ from the manifest "
                f"(missing {missing[:5]}, unexpected {extra[:5]})"
            )
        return {
            e.name: state[e.source].detach().to(dtype_of(e.wire_dtype)) for e in manifest.entries
        }

    @staticmethod
    def _expected(manifest: SyncManifest, wire: dict[str, torch.Tensor]) -> dict[str, int]:
        """Checksums the receiver must read back: wire tensors cast to the engine's dtypes."""
        return {
            e.name: tensor_checksum(wire[e.name].to(dtype_of(manifest.receiver_dtypes[e.name])))
            for e in manifest.entries
        }

    # -- transports ---------------------------------------------------------------------------------

    @distributed(dispatch=Dispatch.BROADCAST)
    def push_local(self, manifest: SyncManifest) -> dict[str, object]:
        """Colocate: hand this rank's gathered tensors to the sibling engine in-process."""
        if self.engine is None:
            raise WeightSyncError(
                "SyncSource.push_local needs the engine sibling (layout=colocate)"
            )
        wire = self._wire(manifest)
        manifest = _with_expected(manifest, self._expected(manifest, wire))
        report = self.engine.receive_local(wire, manifest)
        report["expected"] = manifest.expected
        return report

    @distributed(dispatch=Dispatch.BROADCAST)
    def export(self, manifest: SyncManifest) -> dict[str, object] | None:
        """Object store: every rank gathers; rank 0 puts the CPU payload in Ray's object store
        and returns ``{"box": [ObjectRef], "expected": {...}}`` (other ranks ``None``)."""
        import ray

        wire = self._wire(manifest)
        if self._rank() != 0:
            return None
        payload = {n: t.cpu() for n, t in wire.items()}
        return {"box": [ray.put(payload)], "expected": self._expected(manifest, wire)}

    @distributed(dispatch=Dispatch.BROADCAST)
    def export_buckets(self, manifest: SyncManifest, bucket_bytes: int) -> dict[str, object] | None:
        """Tensor transport: every rank gathers; rank 0 encodes the buckets
        (``tensor_wire.encode_bucket``: bytes with their own checksums), puts each in Ray's
        object store and returns ``{"boxes": [[ObjectRef], ...], "expected": {...}, "bytes": n}``
        (other ranks ``None``)."""
        import ray

        wire = self._wire(manifest)
        if self._rank() != 0:
            return None
        buckets = plan_buckets(manifest.entries, bucket_bytes)
        boxes = []
        sent = 0
        for i, bucket in enumerate(buckets):
            payload = encode_bucket(bucket, wire, index=i, total=len(buckets))
            boxes.append([ray.put(payload)])
            sent += len(payload)
        return {"boxes": boxes, "expected": self._expected(manifest, wire), "bytes": sent}

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def sync_endpoint(self) -> tuple[str, int]:
        """``(host, port)`` for the sync group's store, hosted by trainer rank 0."""
        return node_address(), free_port()

    @distributed(dispatch=Dispatch.BROADCAST)
    def join_sync_group(
        self, host: str, port: int, world_size: int, backend: str, timeout_s: float
    ) -> int | None:
        """Trainer rank 0 joins the sync group as its rank 0 (the other train ranks do not)."""
        if self._rank() != 0:
            return None
        if self._group is None:
            self._group = SyncGroup(
                host=host,
                port=port,
                rank=0,
                world_size=world_size,
                backend=backend,
                timeout_s=timeout_s,
            )
        return 0

    @distributed(dispatch=Dispatch.BROADCAST)
    def send_collective(
        self, manifest: SyncManifest, bucket_bytes: int
    ) -> dict[str, object] | None:
        """Collective: every rank gathers; rank 0 broadcasts bucket after bucket and returns
        ``{"expected": {...}, "bytes": n}``."""
        wire = self._wire(manifest)
        if self._rank() != 0:
            return None
        if self._group is None:
            raise WeightSyncError("SyncSource.send_collective before join_sync_group")
        device = self._group.device if self._group.backend == "nccl" else torch.device("cpu")
        sent = 0
        for bucket in plan_buckets(manifest.entries, bucket_bytes):
            buf = pack(bucket, wire, device)
            self._group.broadcast(buf, src=0)
            sent += bucket.nbytes
        return {"expected": self._expected(manifest, wire), "bytes": sent}

    @distributed(dispatch=Dispatch.BROADCAST)
    def push_ipc(self, manifest: SyncManifest) -> dict[str, object]:
        """CUDA IPC: hand handles of this rank's gathered CUDA tensors to the sibling engine,
        which passes them to its own server process on this GPU."""
        if self.engine is None:
            raise WeightSyncError("SyncSource.push_ipc needs the engine sibling (layout=colocate)")
        wire = self._wire(manifest)
        self._keepalive = wire  # the receiving process reads this memory during the call
        try:
            manifest = _with_expected(manifest, self._expected(manifest, wire))
            report = self.engine.receive_ipc(build_ipc_payload(wire), manifest)
        finally:
            self._keepalive = {}
        report["expected"] = manifest.expected
        return report

    @distributed(dispatch=Dispatch.BROADCAST)
    def trainer_checksums(self, manifest: SyncManifest) -> dict[str, int] | None:
        """Independent read of the live trainer weights, cast as a sync would cast them, for
        comparison with the engine's read-back (a collective; rank 0 returns)."""
        wire = self._wire(manifest)
        return self._expected(manifest, wire) if self._rank() == 0 else None

    @distributed(dispatch=Dispatch.BROADCAST)
    def leave_sync_group(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None

    @distributed(dispatch=Dispatch.RANK_ZERO)
    def pid(self) -> int:
        return os.getpid()


def _with_expected(manifest: SyncManifest, expected: dict[str, int]) -> SyncManifest:
    from dataclasses import replace

    return replace(manifest, expected=expected)
