"""Worker-resident rollout tensors: the bulky parts of a track (``conditions``, ``segment``
and the decoded media) stay on the worker that sampled them, and only a key crosses the
driver.

With the trainside engine the rank that samples a shard is the rank that scores it (the
reward role is its sibling) and trains on it, so sending text embeddings, trajectory latents
and pixels to the driver and back (pickled through the object store) is pure overhead.
:func:`park` stores them in this process's :data:`RESIDENT` store and returns the track
without them plus ``resident_key``; :func:`unpark` puts the fields a role needs back by
``sample_ids`` (the reward role takes ``decoded``, the train stack ``conditions`` and
``segment`` and then drops the entry). A sample that is not resident on this worker is an
error naming the key and the ids, never a silent miss.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from unirl.types.rollout import RolloutResp, RolloutTrack

PARKED_FIELDS = ("conditions", "segment", "decoded")
TRAIN_FIELDS = ("conditions", "segment")


@dataclasses.dataclass
class _Entry:
    sample_ids: list[int]
    fields: dict[str, Any]


class ResidentStore:
    """Process-local ``key -> (sample_ids, fields)``; at most ``capacity`` keys are kept (the
    oldest is dropped first), so a run that never trains on a parked rollout cannot grow it."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self._entries: dict[str, _Entry] = {}

    def put(self, key: str, sample_ids: torch.Tensor, fields: dict[str, Any]) -> None:
        self._entries.pop(key, None)
        self._entries[key] = _Entry([int(i) for i in sample_ids.tolist()], fields)
        while len(self._entries) > self.capacity:
            self._entries.pop(next(iter(self._entries)))

    def take(
        self, key: str, sample_ids: torch.Tensor, fields: tuple[str, ...] = PARKED_FIELDS
    ) -> dict[str, Any]:
        """Rows ``sample_ids`` (in that order) of ``fields``; the entry stays until dropped."""
        entry = self._entries.get(key)
        if entry is None:
            raise KeyError(
                f"no resident rollout tensors under {key!r} on this worker (present: "
                f"{sorted(self._entries)}); the track was made on another worker, already "
                f"trained on, or evicted (the store keeps the newest {self.capacity} keys). "
                "Set rollout.resident=false to ship the tensors through the driver"
            )
        row_of = {sid: row for row, sid in enumerate(entry.sample_ids)}
        wanted = [int(i) for i in sample_ids.tolist()]
        missing = [sid for sid in wanted if sid not in row_of]
        if missing:
            raise KeyError(
                f"samples {missing[:8]} of resident rollout {key!r} were sampled on another "
                "worker (the driver re-sharded the track); set rollout.resident=false"
            )
        rows = torch.tensor([row_of[sid] for sid in wanted], dtype=torch.long)
        values = {k: entry.fields[k] for k in fields}
        if rows.equal(torch.arange(len(entry.sample_ids))):
            return values
        return {k: v.select(rows) if v is not None else None for k, v in values.items()}

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)

    def keys(self) -> list[str]:
        return list(self._entries)


RESIDENT = ResidentStore()


def park(resp: RolloutResp, key: str) -> RolloutResp:
    """Store every track's ``conditions``, ``segment`` and ``decoded`` under
    ``<key>/<track name>`` and return the response without them (``resident_key`` set)."""
    tracks = {}
    for name, track in resp.tracks.items():
        track_key = f"{key}/{name}"
        RESIDENT.put(track_key, track.sample_ids, {f: getattr(track, f) for f in PARKED_FIELDS})
        parked: dict[str, Any] = dict.fromkeys(PARKED_FIELDS)  # each parked field -> None
        tracks[name] = dataclasses.replace(track, **parked, resident_key=track_key)
    return dataclasses.replace(resp, tracks=tracks)


def unpark(track: RolloutTrack, fields: tuple[str, ...] = PARKED_FIELDS) -> RolloutTrack:
    """``track`` with ``fields`` back from the store (rows matched by ``sample_ids``); it keeps
    ``resident_key`` (other roles may still need other fields). A track that was never parked
    comes back unchanged."""
    if track.resident_key is None:
        return track
    values = RESIDENT.take(track.resident_key, track.sample_ids, fields)
    return dataclasses.replace(track, **values)
