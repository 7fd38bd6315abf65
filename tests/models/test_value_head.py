"""The text pipeline's value head (PPO): attached to the trained module before the backend
wraps it (so the optimizer steps it), V(s_t) read at the position that predicts token t, equal
to transformers' own last hidden state through the head; the PPO loss trains it."""

from __future__ import annotations

import pytest
import torch

from unirl.algorithms import PPO
from unirl.config import ConfigError
from unirl.models.common_ar.conditions import PromptConditions
from unirl.types import Packed, TextSegment


def _pipeline(value_head: bool = True):
    from unirl.models.qwen3 import Qwen3Bundle, Qwen3Pipeline

    bundle = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    return Qwen3Pipeline(bundle=bundle, sampler="loop", value_head=value_head)


def _segment() -> tuple[PromptConditions, TextSegment]:
    rows = [torch.tensor([5, 9, 11, 12, 30]), torch.tensor([7, 8, 40])]
    masks = [torch.tensor([False, False, True, True, True]), torch.tensor([False, True, True])]
    segment = TextSegment(tokens=Packed.from_list(rows), loss_mask=Packed.from_list(masks))
    return PromptConditions(prompt_lengths=torch.tensor([2, 1]), temperature=1.0), segment


def test_values_are_the_head_on_transformers_hidden_state() -> None:
    pipeline = _pipeline()
    model = pipeline.bundle.model
    assert float(model.value_head.weight.abs().sum()) == 0.0  # zero-initialised
    with torch.no_grad():
        model.value_head.weight.normal_(generator=torch.Generator().manual_seed(0))
        model.value_head.bias.fill_(0.25)
    conditions, segment = _segment()
    got = pipeline.token_values(conditions, segment).values
    want = torch.zeros(8)
    for lo, hi in [(0, 5), (5, 8)]:
        ids = segment.tokens.values[lo:hi][None]
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
        for t in range(lo, hi):
            if bool(segment.loss_mask.values[t]) and t > lo:
                want[t] = model.value_head(hidden[t - lo - 1])[0]
    torch.testing.assert_close(got.detach(), want, atol=1e-5, rtol=0)
    assert got[0] == 0 and got[1] == 0 and got[5] == 0  # prompt tokens carry no value


def test_the_backend_trains_the_head_under_ppo() -> None:
    from unirl.train import FSDPBackend

    pipeline = _pipeline()
    backend = FSDPBackend(
        bundle=pipeline.bundle, lora=None, param_dtype="fp32", trainable_attr="model"
    )
    head = backend.module.value_head
    assert any(p is head.weight for g in backend.optimizer.param_groups for p in g["params"])
    algo = PPO(policy=pipeline, whiten=False)
    conditions, segment = _segment()
    prepared = algo.prepare_batch(
        [(conditions, algo.prepare_segment(conditions, segment), torch.tensor([1.0, -1.0]))]
    )
    cond, seg, adv = prepared[0]
    backend.zero_grad()
    algo.compute_loss_and_backward(cond, seg, adv, loss_scale=1.0)
    assert float(head.bias.grad.abs()) > 0  # the value loss reaches the head


def test_ppo_refuses_a_pipeline_without_a_head() -> None:
    with pytest.raises(ConfigError, match="has no value head: build the pipeline"):
        PPO(policy=_pipeline(value_head=False))


def test_under_lora_an_adapter_on_the_head_learns() -> None:
    """``value_head`` in ``backend.lora.targets``: the head trains through its adapter (the
    base stays frozen, as every base weight under LoRA)."""
    from unirl.train import FSDPBackend, LoraConfig

    pipeline = _pipeline()
    lora = LoraConfig(rank=2, alpha=4, targets=["q_proj", "value_head"])
    backend = FSDPBackend(bundle=pipeline.bundle, lora=lora, param_dtype="fp32")
    algo = PPO(policy=pipeline, whiten=False)
    algo.bind_backend(backend)
    conditions, segment = _segment()
    prepared = algo.prepare_batch(
        [(conditions, algo.prepare_segment(conditions, segment), torch.tensor([1.0, -1.0]))]
    )
    backend.zero_grad()
    algo.compute_loss_and_backward(*prepared[0], loss_scale=1.0)
    head_grads = [
        p.grad
        for n, p in backend.module.named_parameters()
        if "value_head" in n and "lora_" in n and p.requires_grad
    ]
    assert head_grads and any(g is not None and float(g.abs().sum()) > 0 for g in head_grads)
