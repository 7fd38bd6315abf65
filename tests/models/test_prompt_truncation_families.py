"""Qwen-Image and HunyuanVideo (1.5 and 1.0) cut prompts to ``bundle.max_sequence_length``
tokens after their chat template's dropped prefix, and say so the first time, as SD3, Wan,
FLUX.2 and Z-Image do (tests/trainer/test_degenerate_warnings.py). Each family's real
encoder function runs with its tiny preset's tokenizer and a stand-in text encoder that
returns the token ids as hidden states (the ids are what is checked)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from unirl.models.common import text_encode

LIMIT = 16


class _IdsEncoder(torch.nn.Module):
    """A text encoder whose every hidden state is the input ids (one feature)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # device and dtype for the caller

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> SimpleNamespace:
        hidden = input_ids.float().unsqueeze(-1)
        return SimpleNamespace(hidden_states=[hidden] * 4)


def _qwen_image() -> Callable[[list[str]], Any]:
    from transformers import AutoTokenizer

    from unirl.models.qwen_image import tiny_preset_path
    from unirl.models.qwen_image.text_encode import encode_qwen_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_preset_path() / "tokenizer"))
    return lambda texts: encode_qwen_prompts(
        tokenizer, _IdsEncoder(), texts, max_sequence_length=LIMIT
    )


def _hunyuan_video15() -> Callable[[list[str]], Any]:
    from transformers import AutoTokenizer

    from unirl.models.hunyuan_video import tiny_preset_path
    from unirl.models.hunyuan_video.text_encode import encode_mllm_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_preset_path() / "tokenizer"))
    return lambda texts: encode_mllm_prompts(
        tokenizer, _IdsEncoder(), texts, max_sequence_length=LIMIT
    )


def _hunyuan_video10() -> Callable[[list[str]], Any]:
    from transformers import AutoTokenizer

    from unirl.models.hunyuan_video_v1 import tiny_preset_path
    from unirl.models.hunyuan_video_v1.text_encode import encode_llama_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_preset_path() / "tokenizer"))
    return lambda texts: encode_llama_prompts(
        tokenizer, _IdsEncoder(), texts, max_sequence_length=LIMIT
    )


@pytest.mark.parametrize(
    "encoder", [_qwen_image, _hunyuan_video15, _hunyuan_video10], ids=["qwen_image", "hv15", "hv10"]
)
def test_a_prompt_cut_to_max_sequence_length_is_named_once(
    encoder: Callable[[], Callable[[list[str]], Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(text_encode, "_WARNED_TRUNCATION", set())
    encode = encoder()
    embeds, mask = encode(["a cat"])
    assert capsys.readouterr().out == ""  # fits: nothing said
    assert int(mask.sum()) < LIMIT
    long = "a red cat " * 20
    embeds, mask = encode([long, "a cat"])
    out = capsys.readouterr().out
    assert out.startswith(
        f"[unirl] warning: 1 of 2 prompts are longer than bundle.max_sequence_length={LIMIT} "
        "tokens and are cut to it (the longest, "
    ), out
    assert f"tokens: {long[:77] + '...'!r}); raise bundle.max_sequence_length" in out
    # the warning says what the encoder did: the long prompt's row is full, cut at the limit
    assert embeds.shape[1] <= LIMIT and int(mask[0].sum()) == LIMIT
    encode([long])
    assert capsys.readouterr().out == ""  # once per process
