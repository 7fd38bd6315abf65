"""The request pieces every trainer authors the same way (``unirl.trainer.request``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from unirl.trainer.request import (
    EVAL_ID_OFFSET,
    prompt_metadata,
    prompt_texts,
    rollout_ids,
    sde_indices,
    text_request,
)
from unirl.types import ARSamplingParams


def test_rollout_ids_train_and_eval() -> None:
    sample_ids, group_ids = rollout_ids(2, 3, 4, train=True)
    assert sample_ids.tolist() == list(range(24, 30))
    assert group_ids.tolist() == [8, 8, 8, 9, 9, 9]
    assert sample_ids.dtype == group_ids.dtype == torch.long
    eval_ids, eval_groups = rollout_ids(2, 3, 4, train=False)
    assert eval_ids.tolist() == [EVAL_ID_OFFSET + i for i in range(24, 30)]
    assert torch.equal(eval_groups, group_ids)


def test_prompt_rows_repeat_each_prompt() -> None:
    prompts = [
        SimpleNamespace(prompt="a", metadata={"k": 1}),
        SimpleNamespace(prompt="b", metadata={"k": 2}),
    ]
    assert prompt_texts(prompts, 2).texts == ["a", "a", "b", "b"]
    rows = prompt_metadata(prompts, 2)
    assert rows == [{"k": 1}, {"k": 1}, {"k": 2}, {"k": 2}]
    rows[0]["k"] = 9  # copies, not the prompt's own dict
    assert prompts[0].metadata == {"k": 1} and rows[1] == {"k": 1}


def test_text_request_seeds_are_sample_ids() -> None:
    sampling = ARSamplingParams(
        max_new_tokens=7, temperature=0.9, eval_temperature=0.0, top_p=0.8, top_k=5, stop=["x"]
    )
    ids = torch.arange(3)
    req = text_request(sampling, ids, "train")
    assert req.seed_ids.tolist() == [0, 1, 2] and req.seed_ids is not ids
    assert (req.max_new_tokens, req.temperature, req.top_p, req.top_k, req.stop) == (
        7,
        0.9,
        0.8,
        5,
        ("x",),
    )
    assert text_request(sampling, ids, "eval").temperature == 0.0


def test_sde_indices_same_steps_per_sample_or_none() -> None:
    class Pick:
        def select(self, steps: int, *, seed: int, rollout_index: int) -> tuple[int, ...]:
            return (seed % steps, rollout_index % steps)

    out = sde_indices(Pick(), 5, seed=7, rollout_index=3, n=2, trains=True)
    assert out.tolist() == [[2, 3], [2, 3]] and out.dtype == torch.long
    assert sde_indices(Pick(), 5, seed=7, rollout_index=3, n=2, trains=False).shape == (2, 0)
