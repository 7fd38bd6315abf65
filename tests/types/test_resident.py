"""Worker-resident rollout tensors: parked fields come back by sample id, in the caller's
order; a sample from another worker or an unknown key is an error that names the fix."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from unirl.types import RolloutResp, RolloutTrack, TextEmbedConditions
from unirl.types.resident import RESIDENT, ResidentStore, park, unpark


def _resp(ids: list[int]) -> RolloutResp:
    n = len(ids)
    track = RolloutTrack(
        sample_ids=torch.tensor(ids),
        group_ids=torch.zeros(n, dtype=torch.long),
        conditions=TextEmbedConditions(embeds=torch.arange(n * 2.0).reshape(n, 1, 2)),
    )
    return RolloutResp(tracks={"t": track})


def test_park_then_unpark_restores_rows_in_the_callers_order() -> None:
    parked = park(_resp([10, 11, 12, 13]), "rollout_7")
    track = parked.tracks["t"]
    assert track.conditions is None and track.resident_key == "rollout_7/t"
    shuffled = track.select(torch.tensor([2, 0]))  # the driver may keep any subset, any order
    back = unpark(shuffled)
    assert back.resident_key == "rollout_7/t"  # the entry lives until the trainer drops it
    assert torch.equal(back.sample_ids, torch.tensor([12, 10]))
    assert torch.equal(back.conditions.embeds, torch.tensor([[[4.0, 5.0]], [[0.0, 1.0]]]))
    whole = unpark(track)
    assert torch.equal(whole.conditions.embeds, torch.arange(8.0).reshape(4, 1, 2))
    only = unpark(track, ("decoded",))  # a role takes just what it needs
    assert only.conditions is None and only.decoded is None
    RESIDENT.drop("rollout_7/t")
    with pytest.raises(KeyError, match=r"rollout.resident=false"):
        unpark(track)


def test_a_sample_from_another_worker_is_an_error() -> None:
    track = park(_resp([0, 1]), "rollout_8").tracks["t"]
    foreign = dataclasses.replace(track, sample_ids=torch.tensor([1, 5]))
    with pytest.raises(KeyError, match=r"samples \[5\] .* another worker"):
        unpark(foreign)
    RESIDENT.drop("rollout_8/t")


def test_store_keeps_at_most_capacity_keys() -> None:
    store = ResidentStore(capacity=2)
    for k in ("a", "b", "c"):
        store.put(k, torch.tensor([0]), {"conditions": None})
    assert store.keys() == ["b", "c"]


def test_unparked_track_passes_through() -> None:
    track = _resp([3]).tracks["t"]
    assert unpark(track) is track


def test_latent_segment_keeps_its_schedule_on_the_host() -> None:
    """σ and the SDE step indices stay CPU tensors through ``to``: the replay indexes them
    without waiting on the device."""
    from unirl.types import LatentSegment

    seg = LatentSegment(
        sigmas=torch.linspace(1, 0, 5),
        sde_indices=torch.tensor([[0, 2], [1, 3]]),
        latents=torch.zeros(2, 2, 4),
        next_latents=torch.zeros(2, 2, 4),
    )
    moved = seg.to("meta", dtype=torch.bfloat16)
    assert moved.latents.device.type == "meta" and moved.latents.dtype == torch.bfloat16
    assert moved.sigmas is seg.sigmas and moved.sde_indices is seg.sde_indices
