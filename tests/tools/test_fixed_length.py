"""FixedLengthQwen3Bundle: every completion runs to max_new_tokens (benchmarks compare
frameworks at equal lengths), where the plain bundle stops some at the end-of-sequence id."""

from __future__ import annotations

import torch

from unirl.models.qwen3 import Qwen3Bundle, Qwen3Pipeline
from unirl.tools.fixed_length import FixedLengthQwen3Bundle
from unirl.types import RolloutReq, TextRequest, Texts

MAX_NEW = 24


def _lengths(bundle: Qwen3Bundle) -> list[tuple[int, str]]:
    n = 48
    ids = torch.arange(n)
    req = RolloutReq(
        sample_ids=ids,
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=["What is 3 + 4?"] * n)},
        stage_params={
            "text": TextRequest(seed_ids=ids.clone(), max_new_tokens=MAX_NEW, temperature=1.0)
        },
        seed=0,
    )
    track = Qwen3Pipeline(bundle=bundle).generate(req).tracks["text"]
    return [(m["response_tokens"], m["finish_reason"]) for m in track.metadata]


def test_fixed_length_bundle_never_stops_early_where_the_plain_one_does() -> None:
    plain = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    fixed = FixedLengthQwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    assert plain.stop_token_ids and fixed.stop_token_ids == []
    assert fixed.pad_token_id == plain.pad_token_id
    # the control: with the same seeds the tiny model draws its stop token in some samples
    assert any(reason == "stop" for _, reason in _lengths(plain))
    assert _lengths(fixed) == [(MAX_NEW, "length")] * 48


def test_stop_set_bundle_stops_at_its_ids_with_uneven_lengths() -> None:
    from unirl.tools.fixed_length import StopSetQwen3Bundle, stop_set

    bundle = StopSetQwen3Bundle(path="tiny", dtype="fp32", device="cpu", stop_fraction=0.05)
    vocab = int(bundle.model.config.vocab_size)
    assert bundle.stop_token_ids == list(range(1, 1 + int(0.05 * vocab)))
    assert bundle.prompts.stop_token_ids == bundle.stop_token_ids
    lengths = _lengths(bundle)
    # uneven: some stop early, and the lengths differ (a fixed-length run would give one value)
    assert any(reason == "stop" for _, reason in lengths)
    assert len({n for n, _ in lengths}) > 3
    import pytest

    with pytest.raises(ValueError, match="stop_fraction"):
        stop_set(vocab, 0.0)


def _vl_lengths(bundle: object) -> list[tuple[int, str]]:
    from unirl.models.qwen_vl import QwenVLPipeline
    from unirl.types import Images

    n = 48
    ids = torch.arange(n)
    pixels = torch.rand(n, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    req = RolloutReq(
        sample_ids=ids,
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=["What is x?"] * n), "image": Images(pixels=pixels)},
        stage_params={
            "text": TextRequest(seed_ids=ids.clone(), max_new_tokens=MAX_NEW, temperature=1.0)
        },
        seed=0,
    )
    track = QwenVLPipeline(bundle=bundle).generate(req).tracks["text"]
    return [(m["response_tokens"], m["finish_reason"]) for m in track.metadata]


def test_fixed_length_qwen_vl_bundle_never_stops_early_where_the_plain_one_does() -> None:
    from unirl.models.qwen_vl import QwenVLBundle
    from unirl.tools.fixed_length import FixedLengthQwenVLBundle

    knobs = {"path": "tiny", "dtype": "fp32", "device": "cpu", "image_size": 56}
    plain, fixed = QwenVLBundle(**knobs), FixedLengthQwenVLBundle(**knobs)
    assert plain.stop_token_ids and fixed.stop_token_ids == []
    assert fixed.prompts.stop_token_ids == [] and fixed.pad_token_id == plain.pad_token_id
    assert any(reason == "stop" for _, reason in _vl_lengths(plain))  # the control
    assert _vl_lengths(fixed) == [(MAX_NEW, "length")] * 48
