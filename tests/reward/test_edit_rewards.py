"""Edit rewards: exact values on hand-made pairs, the service's dispatch to ``score_edit``,
and the refusals (no source, bad box, missing colour)."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.reward import EditRewardBackend, RewardError, WeightedRewardBackend
from unirl.reward.local import BrightnessTarget, RegionColorTarget, SourcePreservation, edit_mask
from unirl.reward.service import RewardService
from unirl.types import Images, RolloutTrack

CENTRE = {"edit_box": [0.25, 0.25, 0.75, 0.75], "target_color": [1.0, 0.0, 0.0]}


def test_edit_mask_marks_pixel_centres_inside_the_box() -> None:
    mask = edit_mask({"edit_box": [0.25, 0.25, 0.75, 0.75]}, 4, 8)
    expected = torch.zeros(4, 8, dtype=torch.bool)
    expected[1:3, 2:6] = True
    assert torch.equal(mask, expected)
    assert bool(edit_mask({}, 3, 3).all())


@pytest.mark.parametrize("box", [[0.5, 0.0, 0.5, 1.0], [0, 0, 1], [-0.1, 0, 1, 1], "centre"])
def test_edit_mask_refuses_a_malformed_box(box: object) -> None:
    with pytest.raises(RewardError, match="edit_box"):
        edit_mask({"edit_box": box}, 4, 4)


def test_source_preservation_counts_only_pixels_outside_the_region() -> None:
    source = torch.full((2, 3, 4, 4), 0.5)
    result = source.clone()
    result[0, :, 1:3, 1:3] = 1.0  # inside the box: free
    result[1, :, 0, :] = 0.0  # four outside pixels off by 0.5 (12 outside pixels in all)
    out = SourcePreservation().score_edit(result, source, ["a", "b"], [CENTRE, CENTRE])
    assert out.scores["preserve"].tolist() == pytest.approx([1.0, 1.0 - 0.5 * 4 / 12], abs=1e-7)


def test_source_preservation_gives_nan_with_a_reason_when_nothing_is_outside() -> None:
    img = torch.zeros(1, 3, 4, 4)
    out = SourcePreservation().score_edit(img, img, ["a"], [{"edit_box": [0, 0, 1, 1]}])
    assert math.isnan(float(out.scores["preserve"][0]))
    assert "covers the whole image" in str(out.errors["preserve"][0])


def test_region_color_target_absolute_and_relative() -> None:
    source = torch.zeros(1, 3, 4, 4)  # black: distance to red is (1 + 0 + 0) / 3
    result = source.clone()
    result[0, 0, 1:3, 1:3] = 1.0  # the region painted exactly red
    absolute = RegionColorTarget().score_edit(result, source, ["p"], [CENTRE])
    assert float(absolute.scores["region_color"][0]) == pytest.approx(1.0, abs=1e-7)
    relative = RegionColorTarget(relative=True).score_edit(result, source, ["p"], [CENTRE])
    assert float(relative.scores["region_color"][0]) == pytest.approx(1 / 3, abs=1e-7)
    unchanged = RegionColorTarget(relative=True).score_edit(source, source, ["p"], [CENTRE])
    assert float(unchanged.scores["region_color"][0]) == 0.0


def test_region_color_target_without_a_colour_is_a_named_failure() -> None:
    img = torch.zeros(1, 3, 4, 4)
    out = RegionColorTarget().score_edit(img, img, ["p"], [{"edit_box": [0, 0, 0.5, 0.5]}])
    assert math.isnan(float(out.scores["region_color"][0]))
    assert "target_color" in str(out.errors["region_color"][0])


def test_an_edit_reward_refuses_a_result_without_its_source() -> None:
    assert SourcePreservation.needs_references and issubclass(SourcePreservation, EditRewardBackend)
    with pytest.raises(RewardError, match="source images"):
        SourcePreservation().score(torch.zeros(1, 3, 4, 4), ["a"], [CENTRE])


def test_service_sends_references_to_every_component_of_a_weighted_edit_reward() -> None:
    source = torch.full((2, 3, 4, 4), 0.5)
    result = source.clone()
    result[:, 0, 1:3, 1:3] = 1.0
    result[:, 1:, 1:3, 1:3] = 0.0  # both samples paint the region red, keep the rest
    result[1, :, 0, 0] = 1.0  # sample 1 also changes one outside pixel
    backend = WeightedRewardBackend(
        components={
            "preserve": SourcePreservation(),
            "region_color": RegionColorTarget(),
            "brightness": BrightnessTarget(target=0.5),  # an image scorer: result only
        },
        weights={"preserve": 1.0, "region_color": 1.0, "brightness": 0.0},
    )
    track = RolloutTrack(
        sample_ids=torch.arange(2),
        group_ids=torch.zeros(2, dtype=torch.long),
        prompts=["paint it red", "paint it red"],
        metadata=[dict(CENTRE), dict(CENTRE)],
        decoded=Images(pixels=result),
        references=Images(pixels=source),
    )
    scored, metrics = RewardService(backend=backend).score_track(track)
    preserve = scored.component_rewards["preserve"].tolist()
    assert preserve == pytest.approx([1.0, 1.0 - 0.5 / 12], abs=1e-6)
    assert scored.component_rewards["region_color"].tolist() == pytest.approx([1.0, 1.0])
    assert scored.rewards.tolist() == pytest.approx([2.0, 2.0 - 0.5 / 12], abs=1e-6)
    assert metrics["reward/preserve/mean"] == pytest.approx(sum(preserve) / 2, abs=1e-6)


def test_pooled_preservation_compares_block_averages() -> None:
    """A checkerboard around a flat grey source: every pixel is 0.5 off, every 2x2 block
    average equal; the box's blocks (centre inside) are excluded alike."""
    source = torch.full((1, 3, 8, 8), 0.5)
    board = ((torch.arange(8)[:, None] + torch.arange(8)[None, :]) % 2).float()
    result = board.expand(1, 3, 8, 8).clone()
    meta = [{"edit_box": [0.25, 0.25, 0.75, 0.75]}]
    per_pixel = SourcePreservation().score_edit(result, source, ["p"], meta)
    pooled = SourcePreservation(pool=2).score_edit(result, source, ["p"], meta)
    assert float(per_pixel.scores["preserve"][0]) == pytest.approx(0.5, abs=1e-7)
    assert float(pooled.scores["preserve"][0]) == pytest.approx(1.0, abs=1e-7)
    with pytest.raises(RewardError, match=r"pool=3 does not divide the 8x8 images"):
        SourcePreservation(pool=3).score_edit(result, source, ["p"], meta)
