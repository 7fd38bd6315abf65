"""``bundle.graph_text_encoders``: SD3's text encoders replayed from CUDA graphs.

On CPU: the split of prompt encoding into tokenisation and a host-free encoder pass gives
the eager result through any ``encoders`` callable, the encoder pass traces into one graph
with no break (what a CUDA capture needs: no host synchronisation, no host-dependent
control flow), and the switch is refused off CUDA before anything loads. On a GPU: graphed
embeddings equal the eager ones bit for bit, one graph per prompt count, replays after the
first call, and moving the modules drops the graphs.
"""

from __future__ import annotations

import functools

import pytest
import torch

from unirl.config import ConfigError
from unirl.models.common.cuda_graph import GraphedFunction
from unirl.models.sd3.text_encode import (
    encode_sd3_prompts,
    sd3_encoder_states,
    sd3_token_ids,
)

PROMPTS = ["a red fox, oil painting", 'a neon sign that says "OPEN"']


def test_encoders_callable_sees_token_ids_and_gives_the_eager_result(tiny_sd3_bundle):
    stack = tiny_sd3_bundle._text_stack()
    seen: list[tuple[tuple[int, ...], ...]] = []

    def encoders(*ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        seen.append(tuple(tuple(t.shape) for t in ids))
        return sd3_encoder_states(stack, *ids)

    eager = encode_sd3_prompts(stack, PROMPTS, max_sequence_length=32)
    routed = encode_sd3_prompts(stack, PROMPTS, max_sequence_length=32, encoders=encoders)
    assert seen == [((2, 77), (2, 77), (2, 32))]  # CLIP-L, CLIP-G, T5 token ids
    assert torch.equal(eager[0], routed[0]) and torch.equal(eager[1], routed[1])
    assert eager[0].shape == (2, 77 + 32, 96)


def test_encoder_pass_traces_into_one_graph_without_breaks(tiny_sd3_bundle):
    stack = tiny_sd3_bundle._text_stack()
    ids = sd3_token_ids(stack, PROMPTS, 32)
    torch._dynamo.reset()
    compiled = torch.compile(
        functools.partial(sd3_encoder_states, stack), backend="eager", fullgraph=True
    )
    with torch.no_grad():
        traced = compiled(*ids)  # fullgraph=True raises on any graph break
        eager = sd3_encoder_states(stack, *ids)
    assert len(traced) == 3
    for a, b in zip(traced, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch._dynamo.reset()


def test_switch_is_refused_off_cuda(make_tiny_sd3):
    with pytest.raises(ConfigError, match=r"bundle.graph_text_encoders=true needs a CUDA device"):
        make_tiny_sd3(graph_text_encoders=True)
    with pytest.raises(ValueError, match=r"needs a CUDA device; this one runs on cpu"):
        GraphedFunction(lambda x: (x,), device=torch.device("cpu"), switch="x.graphs")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
def test_graphed_text_encoders_equal_eager_on_cuda(make_tiny_sd3):
    eager = make_tiny_sd3(device="cuda", dtype="bf16", text_encoder_dtype="bf16")
    graphed = make_tiny_sd3(
        device="cuda", dtype="bf16", text_encoder_dtype="bf16", graph_text_encoders=True
    )
    graphed.text_encoder.load_state_dict(eager.text_encoder.state_dict())
    graphed.text_encoder_2.load_state_dict(eager.text_encoder_2.state_dict())
    graphed.text_encoder_3.load_state_dict(eager.text_encoder_3.state_dict())
    for prompts in (PROMPTS, PROMPTS[:1], PROMPTS, ["a third prompt", "and a fourth"]):
        a, b = eager.encode_unique(list(prompts)), graphed.encode_unique(list(prompts))
        assert torch.equal(a.prompt_embeds, b.prompt_embeds)
        assert torch.equal(a.pooled_prompt_embeds, b.pooled_prompt_embeds)
    graph = graphed._graphs["text_encoders"]
    assert (graph.captures, graph.replays) == (2, 4)  # one graph per prompt count
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:  # the benchmark's FLOP count sees the work
        b = graphed.encode_unique(list(PROMPTS))
    assert counter.get_total_flops() > 0 and graph.replays == 4
    assert torch.equal(eager.encode_unique(list(PROMPTS)).prompt_embeds, b.prompt_embeds)
    graphed.offload()
    assert graphed._graphs == {}  # the weights move: their addresses in the graphs go stale
    graphed.onload()
    b = graphed.encode_unique(list(PROMPTS))
    assert torch.equal(eager.encode_unique(list(PROMPTS)).prompt_embeds, b.prompt_embeds)
    assert graphed._graphs["text_encoders"].captures == 1
