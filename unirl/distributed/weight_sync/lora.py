"""``LoraSync``: the trainer's adapter tensors -> the engine's peft-injected adapter copy."""

from __future__ import annotations

from typing import ClassVar

from unirl.distributed.weight_sync.base import WeightSync


class LoraSync(WeightSync):
    """Moves only the trained LoRA adapter (tens of MB for SD3.5-M at rank 32).

    The receiver injects an adapter with the trainer's rank / alpha / targets on the first
    sync and loads the tensors into it; with ``merged_lora`` it then folds the delta into its
    base weights (restored from a pristine copy first, so repeated syncs do not drift).
    Transports: ``local`` (colocate, in-process), ``object_store`` (default for separate:
    trainer rank 0 puts one payload in Ray's object store, every rollout rank reads it),
    ``collective`` (bucketed broadcast over the sync group).
    """

    kind: ClassVar[str] = "lora"
    default_transport: ClassVar[dict[str, str]] = {"colocate": "local", "separate": "object_store"}
