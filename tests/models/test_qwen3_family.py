"""The Qwen3 family on its tiny preset: the shared text-family contract
(``text_family_tester.py``: greedy generation = transformers', recorded log-probs = replay,
first GRPO ratio exactly 1, LoRA round trip, a sample alone = in a batch), plus presets and
sources, stops, truncation, the packed token policy (rows independent), LoRA targets, and the
real-shape arch preset on meta."""

from __future__ import annotations

import math

import pytest
import torch
from text_family_tester import TextFamilyTester

from unirl.config import ConfigError
from unirl.models.common_ar.generate import draw_tokens, policy_log_probs
from unirl.models.qwen3 import Qwen3Bundle, Qwen3Pipeline
from unirl.types import Packed, RolloutReq, TextRequest, Texts

PROMPTS = ["What is 3 + 4?", "What is 2 * 5?", "a photo of a cat", "What is 9 - 1?"]


@pytest.fixture(scope="module")
def bundle() -> Qwen3Bundle:
    return Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")


def request(prompts: list[str], ids: list[int], *, seed: int = 0, **knobs: object) -> RolloutReq:
    n = len(prompts)
    block = {"max_new_tokens": 10, "temperature": 1.0, **knobs}
    return RolloutReq(
        sample_ids=torch.tensor(ids),
        group_ids=torch.zeros(n, dtype=torch.long),
        primitives={"text": Texts(texts=prompts)},
        stage_params={"text": TextRequest(seed_ids=torch.tensor(ids), **block)},  # type: ignore[arg-type]
        seed=seed,
    )


def test_tiny_preset_loads_with_chat_template_and_stop_token(bundle: Qwen3Bundle) -> None:
    n_params = sum(p.numel() for p in bundle.model.parameters())
    assert 50_000 < n_params < 1_000_000
    assert type(bundle.model).__name__ == "Qwen3ForCausalLM"
    assert bundle.stop_token_ids == [bundle.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    text = bundle.prompt_text("What is 3 + 4?")
    assert text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    assert not any(p.requires_grad for p in bundle.model.parameters())  # the backend decides


def test_sources_refuse_unknown_paths_naming_the_presets(tmp_path) -> None:
    with pytest.raises(ConfigError, match="qwen3-4b-arch"):
        Qwen3Bundle.check_config({"path": str(tmp_path)}, None)  # a folder without config.json
    with pytest.raises(ConfigError, match="path=tiny"):
        Qwen3Bundle.check_config({"path": "not a hub id"}, None)
    Qwen3Bundle.check_config({"path": "Qwen/Qwen3-4B-Base"}, None)  # a hub id: checked at load


def test_arch_preset_has_the_released_shapes_on_meta() -> None:
    model = Qwen3Bundle.trainable_on_meta({"path": "qwen3-4b-arch"})
    assert model is not None and next(model.parameters()).device.type == "meta"
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (2560, 36, 32)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (8, 128, 151936)
    # tied embeddings: parameters() lists the shared matrix once; Qwen3-4B has 4.02 B
    count = sum(p.numel() for p in model.parameters())
    assert 4.00e9 < count < 4.05e9, count
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    assert set(Qwen3Bundle.lora_default_targets) <= names


def test_track_layout_and_recorded_log_probs_equal_the_packed_replay(bundle: Qwen3Bundle) -> None:
    pipe = Qwen3Pipeline(bundle=bundle, forward_batch_size=3)  # two generation batches
    track = pipe.generate(request(PROMPTS, [0, 1, 2, 3])).tracks["text"]
    seg, cond = track.segment, track.conditions
    prompt_ids = bundle.encode_prompts(PROMPTS)
    for i, ids in enumerate(prompt_ids):
        row, mask = seg.tokens.row(i), seg.loss_mask.row(i)
        assert row[: len(ids)].tolist() == ids and int(cond.prompt_lengths[i]) == len(ids)
        assert not mask[: len(ids)].any() and mask[len(ids) :].all()
        assert int(mask.sum()) == track.metadata[i]["response_tokens"] <= 10
    replay = pipe.token_log_probs(cond, seg).values
    m = seg.loss_mask.values
    gap = (replay[m] - seg.log_probs.values[m]).abs().max()
    assert float(gap) < 1e-5, float(gap)  # KV-cached sampling vs one packed forward, fp32
    assert torch.all(replay[~m] == 0) and torch.all(seg.log_probs.values[m] <= 0)


def test_packed_rows_do_not_see_each_other(bundle: Qwen3Bundle) -> None:
    pipe = Qwen3Pipeline(bundle=bundle)
    track = pipe.generate(request(PROMPTS, [0, 1, 2, 3])).tracks["text"]
    seg, cond = track.segment, track.conditions
    packed = Packed(values=pipe.token_log_probs(cond, seg).values, offsets=seg.tokens.offsets)
    for i in range(len(PROMPTS)):
        alone = pipe.token_log_probs(cond.select([i]), seg.select([i])).values
        torch.testing.assert_close(alone, packed.row(i), atol=2e-6, rtol=0)


def test_stop_strings_end_a_completion_and_stay_in_it(bundle: Qwen3Bundle) -> None:
    pipe = Qwen3Pipeline(bundle=bundle)
    free = pipe.generate(request(PROMPTS, [0, 1, 2, 3], max_new_tokens=24)).tracks["text"]
    # a stop string the free-running sample produces: its completion must end right there
    text = free.decoded.texts[0]
    stop = text[len(text) // 2 : len(text) // 2 + 1]
    assume = stop and stop.isprintable() and stop in text
    if not assume:
        pytest.skip("the tiny model's completion has no printable character to stop at")
    cut = pipe.generate(request(PROMPTS, [0, 1, 2, 3], max_new_tokens=24, stop=(stop,)))
    first = cut.tracks["text"]
    assert first.metadata[0]["finish_reason"] == "stop"
    assert stop in first.decoded.texts[0]
    assert first.metadata[0]["response_tokens"] <= free.metadata[0]["response_tokens"]
    assert all(m["response_tokens"] <= 24 for m in free.metadata)


def test_response_prefix_is_prompt_and_returns_in_the_text(bundle: Qwen3Bundle) -> None:
    prefixed = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu", response_prefix="\\boxed{")
    assert prefixed.prompt_text("x").endswith("assistant\n\\boxed{")
    track = Qwen3Pipeline(bundle=prefixed).generate(request(["x"], [5])).tracks["text"]
    assert track.decoded.texts[0].startswith("\\boxed{")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        Qwen3Bundle(path="tiny", dtype="fp32", device="cpu", max_prompt_tokens=3).encode_prompts(
            ["a long prompt"]
        )


def test_draw_tokens_follows_the_distribution_and_its_truncations() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20_000, 1)
    u = torch.rand(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probs = torch.softmax(logits[0] / 0.7, -1)
    counts = torch.bincount(draw_tokens(logits, u, temperature=0.7), minlength=5).double()
    torch.testing.assert_close(counts / 20_000, probs.double(), atol=0.01, rtol=0)
    top2 = draw_tokens(logits, u, temperature=0.7, top_k=2)
    assert set(top2.tolist()) == {0, 1}
    top_p = draw_tokens(logits, u, temperature=1.0, top_p=0.5)  # p0 = 0.64 alone holds 0.5
    assert set(top_p.tolist()) == {0}
    assert torch.equal(draw_tokens(logits[:3], u[:3], temperature=0.0), torch.zeros(3).long())
    # the recorded policy is the full temperature-scaled softmax, never the truncated one
    lp = policy_log_probs(logits[:1], 0.7)[0]
    assert math.isclose(float(lp.exp().sum()), 1.0, rel_tol=1e-6)


def test_lora_defaults_fit_the_model_and_disabling_gives_the_base(bundle: Qwen3Bundle) -> None:
    from unirl.train import FSDPBackend, LoraConfig

    own = Qwen3Bundle(path="tiny", dtype="fp32", device="cpu")
    pipe = Qwen3Pipeline(bundle=own)
    track = pipe.generate(request(PROMPTS, [0, 1, 2, 3])).tracks["text"]
    before = pipe.token_log_probs(track.conditions, track.segment).values
    backend = FSDPBackend(
        bundle=own, lora=LoraConfig(rank=4, alpha=8), param_dtype="fp32", trainable_attr="model"
    )
    assert backend.num_trainable_params() > 0
    with torch.no_grad():
        for name, p in backend.named_trainable_parameters():
            if "lora_B" in name:
                p.add_(0.1)
    with torch.no_grad():
        moved = pipe.token_log_probs(track.conditions, track.segment).values
        with backend.adapter_disabled():
            base = pipe.token_log_probs(track.conditions, track.segment).values
    assert float((moved - before).abs().max()) > 1e-3
    torch.testing.assert_close(base, before, atol=1e-6, rtol=0)


def test_a_save_pretrained_folder_loads_as_the_same_model(bundle: Qwen3Bundle, tmp_path) -> None:
    bundle.model.save_pretrained(str(tmp_path))
    bundle.tokenizer.save_pretrained(str(tmp_path))
    again = Qwen3Bundle(path=str(tmp_path), dtype="fp32", device="cpu")
    ids = torch.tensor([bundle.encode_prompts(PROMPTS[:1])[0]])
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids).logits, bundle.model(ids).logits)
    assert again.encode_prompts(PROMPTS) == bundle.encode_prompts(PROMPTS)
    formatter = Qwen3Bundle.prompt_formatter({"path": str(tmp_path)})  # tokenizer only
    assert formatter.encode_prompts(PROMPTS) == bundle.encode_prompts(PROMPTS)
    assert formatter.stop_token_ids == bundle.stop_token_ids


class TestQwen3TextFamily(TextFamilyTester):
    pipeline_class = Qwen3Pipeline
    bundle_class = Qwen3Bundle
