"""The text stage's training path without Ray: the tiny Qwen3 samples, ``TrainStack`` trains
with GRPO / DRPO on token-budget micro-batches. First ratio exactly 1 (fp32 CPU, replay), the
update independent of the token budget, and the packing itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from unirl.algorithms import DRPO, GRPO
from unirl.config import ConfigError
from unirl.models.qwen3 import Qwen3Bundle, Qwen3Pipeline
from unirl.train import FSDPBackend, LoraConfig, TrainStack
from unirl.train.stack import pack_by_tokens
from unirl.types import RolloutReq, RolloutTrack, TextRequest, Texts

PROMPTS = ["What is 3 + 4?", "What is 12 - 5?", "a photo of a cat", "What is 9 - 1?"]


def rollout(pipe: Qwen3Pipeline, spp: int = 4) -> RolloutTrack:
    n = len(PROMPTS) * spp
    ids = torch.arange(100, 100 + n)
    req = RolloutReq(
        sample_ids=ids,
        group_ids=torch.arange(len(PROMPTS)).repeat_interleave(spp),
        primitives={"text": Texts(texts=[p for p in PROMPTS for _ in range(spp)])},
        stage_params={"text": TextRequest(seed_ids=ids, max_new_tokens=12, temperature=1.0)},
        seed=3,
    )
    track = pipe.generate(req).tracks["text"]
    adv = torch.randn(n, generator=torch.Generator().manual_seed(1))
    return dataclasses.replace(track, advantages=adv)


def build(kind: str = "grpo", lora: bool = True, **stack: object):
    bundle = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    pipe = Qwen3Pipeline(bundle=bundle)
    backend = FSDPBackend(
        bundle=bundle,
        lora=LoraConfig(rank=4, alpha=8) if lora else None,
        optimizer={"lr": 1e-2},
        param_dtype="fp32",
        trainable_attr="model",
    )
    algo = (
        GRPO(policy=pipe, clip_low=0.2, clip_high=0.28)
        if kind == "grpo"
        else DRPO(policy=pipe, epsilon=0.2)
    )
    knobs = {"num_updates_per_batch": 2, "max_tokens_per_micro_batch": 64, **stack}
    return pipe, backend, algo, TrainStack(backend=backend, algorithm=algo, **knobs)


@pytest.mark.parametrize("kind", ["grpo", "drpo"])
def test_first_ratio_is_exactly_one_on_token_budget_micro_batches(kind: str) -> None:
    pipe, _, algo, stack = build(kind)
    track = rollout(pipe)
    before = stack.param_checksum()
    out = stack.train_track(track, 0)
    first, second = out["steps"]
    assert first["ratio/min"] == 1.0 == first["ratio/max"]  # anchored at this geometry
    assert first["micro_batches"] >= 2  # 16 samples of ~40 tokens do not fit 64 tokens
    assert second["ratio/max"] != 1.0 or second["ratio/min"] != 1.0  # the first step moved
    assert out["param_checksum"] != before
    gap = algo.after_train(0)["rollout/logp_gap"]
    assert 0.0 <= gap < 1e-5  # trainside fp32: the sampler's log-probs are the replay's


def test_the_update_does_not_depend_on_the_token_budget() -> None:
    results = []
    for budget in (48, 4096):
        torch.manual_seed(0)
        pipe, backend, _, stack = build(lora=False, num_updates_per_batch=1)
        stack.config = dataclasses.replace(stack.config, max_tokens_per_micro_batch=budget)
        out = stack.train_track(rollout(pipe), 0)
        # the gradient the step applied (Adam's update amplifies ulp-level differences of
        # near-zero gradient entries, so compare what the loss produced)
        grads = [p.grad.detach().clone() for p in backend.trainable_parameters()]
        results.append((out["steps"][0], grads))
    (small, grads_small), (big, grads_big) = results
    assert small["micro_batches"] > 1 and big["micro_batches"] == 1
    assert small["loss"] == pytest.approx(big["loss"], rel=1e-5, abs=1e-7)
    assert small["grad_norm"] == pytest.approx(big["grad_norm"], rel=1e-5)
    for a, b in zip(grads_small, grads_big, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


def test_pack_by_tokens_respects_the_budget_and_a_requested_count() -> None:
    lengths = torch.tensor([30, 10, 25, 5, 40, 70, 12])
    bins = pack_by_tokens(lengths, 50)
    rows = sorted(int(i) for b in bins for i in b)
    assert rows == list(range(7))  # every row once
    for b in bins:
        load = int(lengths[b].sum())
        assert load <= 50 or len(b) == 1  # only a row over the budget stands alone
    assert [b.tolist() for b in bins] == [b.tolist() for b in pack_by_tokens(lengths, 50)]
    assert len(bins) == 4  # first-fit decreasing: 70 | 40+10 | 30+12+5 | 25
    more = pack_by_tokens(lengths, 50, count=6)
    assert len(more) == 6 and sorted(int(i) for b in more for i in b) == list(range(7))
    assert all(int(lengths[b].sum()) <= 50 or len(b) == 1 for b in more)
    with pytest.raises(ValueError, match="cannot cut"):
        pack_by_tokens(lengths, 50, count=8)


def test_token_budget_config_rules() -> None:
    from unirl.train import TrainStackConfig

    with pytest.raises(ConfigError, match="set one"):
        TrainStackConfig(micro_batch_size=4, max_tokens_per_micro_batch=128)
    _, backend, algo, _ = build()
    stack = TrainStack(backend=backend, algorithm=algo, max_tokens_per_micro_batch=32)
    with pytest.raises(ConfigError, match="packs text segments"):
        stack.plan_micro_batches(object(), 4)
