"""Trainer -> dedicated-engine weight transfer (LoRA and full; local, object store, a
dedicated torch.distributed group, CUDA IPC, checksummed tensor buckets over the engine's own
API), verified by read-back checksums. See README.md.

Importing this package loads torch but neither Ray nor peft (both load where used).
"""

from __future__ import annotations

from unirl.distributed.weight_sync.base import WeightSync, build_sync, strip_adapter
from unirl.distributed.weight_sync.bucket import Bucket, pack, plan_buckets, unpack
from unirl.distributed.weight_sync.checksum import (
    checksums,
    digest,
    expected_checksum,
    tensor_checksum,
)
from unirl.distributed.weight_sync.driver import WeightSyncDriver
from unirl.distributed.weight_sync.full import FullSync
from unirl.distributed.weight_sync.group import SyncGroup, free_port, node_address
from unirl.distributed.weight_sync.ipc import (
    CudaIpcSync,
    IpcPayload,
    build_ipc_payload,
    open_ipc_payload,
)
from unirl.distributed.weight_sync.lora import LoraSync
from unirl.distributed.weight_sync.manifest import (
    SyncManifest,
    TensorMeta,
    WeightSyncError,
    check_manifest,
    compare_checksums,
)
from unirl.distributed.weight_sync.receiver import ModuleReceiver, WeightReceiver
from unirl.distributed.weight_sync.remap import NameRemap, RemapRule, canonical_name
from unirl.distributed.weight_sync.source import SyncSource
from unirl.distributed.weight_sync.tensor_wire import DecodedBucket, decode_bucket, encode_bucket

__all__ = [
    "Bucket",
    "CudaIpcSync",
    "DecodedBucket",
    "FullSync",
    "IpcPayload",
    "LoraSync",
    "ModuleReceiver",
    "NameRemap",
    "RemapRule",
    "SyncGroup",
    "SyncManifest",
    "SyncSource",
    "TensorMeta",
    "WeightReceiver",
    "WeightSync",
    "WeightSyncDriver",
    "WeightSyncError",
    "build_ipc_payload",
    "build_sync",
    "canonical_name",
    "check_manifest",
    "checksums",
    "compare_checksums",
    "decode_bucket",
    "digest",
    "encode_bucket",
    "expected_checksum",
    "free_port",
    "node_address",
    "open_ipc_payload",
    "pack",
    "plan_buckets",
    "strip_adapter",
    "tensor_checksum",
    "unpack",
]
