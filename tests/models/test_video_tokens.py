"""``video_grid(...).tokens`` (the pre-flight count sequence parallelism checks divisibility with) equals
the length the Ulysses plan actually splits: the rotary table each video transformer builds
for a latent of the bundle's own shape, on the tiny Wan 2.1, HunyuanVideo 1.5 and 1.0 models,
at geometries whose latent frames and patch grid differ."""

from __future__ import annotations

import pytest
import torch

from unirl.models.common.sequence_parallel import plan_of
from unirl.types import DiffusionSamplingParams

FAMILIES = {
    "wan": "unirl.models.wan:WanBundle",
    "hunyuan_video15": "unirl.models.hunyuan_video:HunyuanVideo15Bundle",
    "hunyuan_video": "unirl.models.hunyuan_video_v1:HunyuanVideoBundle",
}
# (height, width, frames): latent frames 1, 2 and 3; square and not
GEOMETRIES = [(48, 48, 1), (32, 48, 5), (64, 32, 9)]


def _bundle(family: str) -> object:
    module, name = FAMILIES[family].split(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    return cls(path="tiny", dtype="fp32", text_encoder_dtype="fp32", device="cpu")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_video_tokens_is_the_length_the_plan_splits(family: str) -> None:
    bundle = _bundle(family)
    transformer = bundle.trainable_module  # type: ignore[attr-defined]
    plan = plan_of(transformer)
    rope = dict(transformer.named_modules())[plan.rope]
    architecture = type(bundle).architecture("tiny")  # type: ignore[attr-defined]
    counts = []
    for height, width, frames in GEOMETRIES:
        params = DiffusionSamplingParams(height=height, width=width, num_frames=frames)
        shape = bundle.latent_shape_for(params)  # type: ignore[attr-defined]
        with torch.no_grad():
            table = rope(torch.zeros(1, *shape))
        first = table[0] if isinstance(table, tuple) else table
        expected = first.shape[plan.rope_dim]
        grid = type(bundle).video_grid(architecture)  # type: ignore[attr-defined]
        counted = grid.tokens(height, width, frames)
        assert counted == expected, (family, height, width, frames, counted, expected)
        counts.append(counted)
    assert len(set(counts)) == len(counts), counts  # the geometries really differ
