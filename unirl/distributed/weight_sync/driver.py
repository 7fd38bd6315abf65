"""``WeightSyncDriver``: the driver-side orchestration of one sync, for any transport.

Order of a sync (every step raises with the offending tensors named):

1. plan once: the trainer's manifest (names after ``name_remap``, shapes, dtypes), checked by
   every engine rank against its own table (``prepare_sync``) — before any byte moves;
2. move: ``local`` / ``cuda_ipc`` (each worker hands over in-process), ``object_store``
   (trainer rank 0 puts once, engines read), ``collective`` (bucketed broadcast), ``tensor``
   (checksummed byte buckets the engine forwards through its own API);
3. verify: each engine rank's read-back checksums against the sender's expected ones.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from unirl.distributed.weight_sync.base import WeightSync
from unirl.distributed.weight_sync.checksum import digest
from unirl.distributed.weight_sync.manifest import SyncManifest, WeightSyncError, compare_checksums

if TYPE_CHECKING:
    from unirl.distributed.group.handle import Handle


class WeightSyncDriver:
    """Runs syncs from ``source`` (a ``SyncSource`` Handle on the train slab) to ``engine``
    (a ``WeightReceiver`` engine Handle) under ``layout``; ``interval`` is the effective
    sync interval (the sync block's, else the run's ``sync_interval``). ``group_backend``:
    ``gloo`` (CPU) or ``nccl`` (CUDA) for the collective transport."""

    def __init__(
        self,
        *,
        sync: WeightSync,
        source: Handle,
        engine: Handle,
        layout: str,
        interval: int,
        group_backend: str = "gloo",
    ) -> None:
        self.sync = sync
        self.source = source
        self.engine = engine
        self.layout = layout
        self.transport = sync.transport_for(layout)
        self.interval = max(int(interval), 0)
        self.group_backend = group_backend
        self.manifest: SyncManifest | None = None
        self._group_ready = False
        self.count = 0

    def due(self, rollout_index: int) -> bool:
        """Sync after training rollout ``rollout_index`` (``interval`` 0 never syncs)."""
        return self.interval > 0 and (rollout_index + 1) % self.interval == 0

    # -- one sync --------------------------------------------------------------------------------

    def plan(self) -> SyncManifest:
        """Manifest checked by every engine rank, wire dtypes fixed (cached after the first call)."""
        if self.manifest is None:
            raw = self.source.manifest()
            per_rank = self.engine.prepare_sync(raw)
            first = per_rank[0]
            for r, dtypes in enumerate(per_rank):
                if dtypes != first:
                    raise WeightSyncError(
                        f"rollout rank {r} holds different dtypes than rank 0: {dtypes} vs {first}"
                    )
            manifest = raw.with_receiver_dtypes(first, self.sync.wire_dtype)
            self.engine.prepare_sync(manifest)  # receivers keep the final manifest
            self.manifest = manifest
        return self.manifest

    def run(self, *, reason: str = "interval") -> dict[str, float]:
        """One verified sync; returns ``sync/*`` metrics."""
        t0 = time.perf_counter()
        manifest = replace(self.plan(), version=self.count)
        if self.transport in ("local", "cuda_ipc"):
            method = "push_local" if self.transport == "local" else "push_ipc"
            reports = self.source.call(method, manifest)
            expected = reports[0]["expected"]
            for r in reports:
                if r["expected"] != expected:
                    raise WeightSyncError(
                        "train ranks gathered different tensors for the colocated sync"
                    )
        elif self.transport == "object_store":
            sent = [s for s in self.source.export(manifest) if s is not None]
            expected = sent[0]["expected"]
            # receivers check locally too (their error names the rank); the driver re-checks below
            checked = replace(manifest, expected=expected)
            reports = self.engine.receive_ref(sent[0]["box"], checked)
        elif self.transport == "tensor":
            sent = [
                s
                for s in self.source.export_buckets(manifest, self.sync.bucket_bytes)
                if s is not None
            ]
            expected = sent[0]["expected"]
            checked = replace(manifest, expected=expected)
            reports = self.engine.receive_tensor_buckets(sent[0]["boxes"], checked)
        elif self.transport == "collective":
            self._join_group()
            pending = (
                self.source.call_async("send_collective", manifest, self.sync.bucket_bytes),
                self.engine.call_async("receive_collective", manifest, self.sync.bucket_bytes),
            )
            sent_all, reports = type(self.engine).wait(*pending)
            expected = next(s for s in sent_all if s is not None)["expected"]
        else:  # pragma: no cover - transport_for validated it
            raise WeightSyncError(f"unknown transport {self.transport!r}")
        for rank, report in enumerate(reports):
            compare_checksums(
                expected, report["checksums"], where=f"sync #{self.count} to rollout rank {rank}"
            )
            if manifest.kind == "lora" and manifest.merged_lora and not report.get("merged", False):
                raise WeightSyncError(
                    f"sync #{self.count}: rollout rank {rank} did not merge the LoRA adapter"
                )
        elapsed = time.perf_counter() - t0
        nbytes = manifest.wire_bytes()
        self.count += 1
        return {
            "sync/time_s": elapsed,
            "sync/bytes": float(nbytes),
            "sync/num_tensors": float(len(manifest.entries)),
            "sync/gbps": nbytes / max(elapsed, 1e-9) / 1e9,
            "sync/receivers": float(len(reports)),
            "sync/forced": 1.0 if reason != "interval" else 0.0,
            "sync/count": float(self.count),
            "sync/trainer_digest": digest(expected),
            "sync/engine_digest": digest(reports[0]["checksums"]),
        }

    def _join_group(self) -> None:
        if self._group_ready:
            return
        host, port = self.source.sync_endpoint()
        world = 1 + self.engine.world_size
        args = (host, port, world, self.group_backend, self.sync.timeout_s)
        type(self.engine).wait(
            self.source.call_async("join_sync_group", *args),
            self.engine.call_async("join_sync_group", *args),
        )
        self._group_ready = True

    def close(self) -> None:
        if self._group_ready:
            type(self.engine).wait(
                self.source.call_async("leave_sync_group"),
                self.engine.call_async("leave_sync_group"),
            )
            self._group_ready = False
