"""Legal but degenerate settings are named in a warning on the first rollout: greedy token
sampling (identical groups, zero advantages), prompts cut to the text encoder's length, and
sequences over the token budget of a micro-batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from unirl.config.entry import compose_recipe
from unirl.config.run import RunConfig
from unirl.models.common import text_encode
from unirl.trainer.base import degenerate_sampling_warnings


def _cfg(*overrides: str) -> RunConfig:
    return RunConfig.from_dict(compose_recipe("llm/qwen3_tiny_grpo", list(overrides)))


def test_greedy_sampling_is_named() -> None:
    assert degenerate_sampling_warnings(_cfg()) == []
    assert degenerate_sampling_warnings(_cfg("sampling.temperature=0")) == [
        "[unirl] warning: sampling.temperature=0 samples greedily: the 8 completions of each "
        "prompt are identical, so every group's advantages and the gradients are zero and the "
        "run trains nothing; set sampling.temperature > 0 (e.g. 1.0) to train"
    ]
    # one sample per prompt: no group to be identical in
    one = _cfg("sampling.temperature=0", "sampling.samples_per_prompt=1")
    assert degenerate_sampling_warnings(one) == []
    diffusion = RunConfig.from_dict(compose_recipe("diffusion/sd3_tiny_trainside"))
    assert degenerate_sampling_warnings(diffusion) == []


class _WordTokenizer:
    """One token per word plus an end token (``add_special_tokens``)."""

    def __call__(self, texts: list[str], add_special_tokens: bool = True) -> SimpleNamespace:
        end = [0] if add_special_tokens else []
        return SimpleNamespace(input_ids=[[1] * len(t.split()) + end for t in texts])


def test_truncated_prompts_are_named_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text_encode, "_WARNED_TRUNCATION", set())
    tok = _WordTokenizer()
    key = "bundle.max_sequence_length"
    assert text_encode.warn_truncated_prompts(tok, ["a b c", "d e"], 4, key) == 0
    assert capsys.readouterr().out == ""
    texts = ["a b c d e f g", "short", "a b c d e"]
    assert text_encode.warn_truncated_prompts(tok, texts, 4, key) == 2
    assert capsys.readouterr().out == (
        "[unirl] warning: 2 of 3 prompts are longer than bundle.max_sequence_length=4 tokens "
        "and are cut to it (the longest, 8 tokens: 'a b c d e f g'); raise "
        "bundle.max_sequence_length or shorten the prompts (warned once per process)\n"
    )
    assert text_encode.warn_truncated_prompts(tok, texts, 4, key) == 2  # counted, not repeated
    assert capsys.readouterr().out == ""


def test_a_family_encoder_warns_on_a_long_prompt(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SD3's T5 path (the tiny preset's tokenizer) cuts at bundle.max_sequence_length, and says
    so the first time."""
    from transformers import AutoTokenizer

    from unirl.models.sd3 import tiny_preset_path
    from unirl.models.sd3.text_encode import t5_embeds

    monkeypatch.setattr(text_encode, "_WARNED_TRUNCATION", set())
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_preset_path() / "tokenizer_3"))
    encoder = lambda ids: (ids.float(),)  # noqa: E731  the ids are what we check
    encoder.parameters = lambda: iter([torch.zeros(1)])  # type: ignore[attr-defined]
    t5_embeds(tokenizer, encoder, ["a cat"], 16)
    assert capsys.readouterr().out == ""
    t5_embeds(tokenizer, encoder, ["a cat " * 40], 16)
    out = capsys.readouterr().out
    assert out.startswith(
        "[unirl] warning: 1 of 1 prompts are longer than bundle.max_sequence_length=16 tokens"
    )


def test_sequences_over_the_token_budget_are_named() -> None:
    from unirl.train.stack import TrainStack, TrainStackConfig

    stack = TrainStack.__new__(TrainStack)
    stack.config = TrainStackConfig(max_tokens_per_micro_batch=10)
    stack.backend = SimpleNamespace(device=torch.device("cpu"))
    lengths = torch.tensor([4, 12, 3, 5])
    segment = SimpleNamespace(tokens=SimpleNamespace(lengths=lengths))
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        stack.plan_micro_batches(segment, 4)
        stack.plan_micro_batches(segment, 4)
    assert buf.getvalue() == (
        "[unirl] warning: 1 of 4 sequences on this rank are longer than "
        "stack.max_tokens_per_micro_batch=10 (longest 12 tokens); each trains in a micro-batch "
        "of its own, over the budget; raise it to at least 12\n"
    )
